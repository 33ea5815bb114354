"""The ``data`` config section (sparse2d.train.config.data)."""

from __future__ import annotations

import pytest

from sparse2d.errors import ConfigError
from sparse2d.train.config.data import CriteoConfig, DataConfig, SyntheticConfig


def test_criteo_needs_train_and_held_out_files() -> None:
    with pytest.raises(ConfigError, match=r"criteo.train_files=\[\] is empty"):
        DataConfig(source="criteo")
    with pytest.raises(ConfigError, match=r"criteo.eval_files=\[\] is empty"):
        DataConfig(source="criteo", criteo=CriteoConfig(train_files=["day_0.tsv"]))
    DataConfig(source="criteo", criteo=CriteoConfig(train_files=["a"], eval_files=["b"]))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"zipf_exponent": 0.0}, "zipf_exponent=0.0 must be > 0"),
        ({"ids_per_feature": 0}, "ids_per_feature=0 must be > 0"),
        ({"sparse_weight": -1.0}, "sparse_weight=-1.0 must be >= 0"),
    ],
)
def test_synthetic_values_are_checked(kwargs: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        SyntheticConfig(**kwargs)
    assert SyntheticConfig().zipf_exponent == 1.1
