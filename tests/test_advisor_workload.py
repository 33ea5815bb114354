"""The advisor's plain workload: optimizer state per row, totals, and clear errors."""

from __future__ import annotations

import pytest

from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.errors import ConfigError


def test_state_values_per_row_and_weight_bytes() -> None:
    w = Workload(tables=(TableLoad("a", 10, 8), TableLoad("b", 5, 8)), optimizer="adam")
    assert w.weight_bytes == (10 + 5) * 8 * 4
    assert w.row_state_values(8) == 16
    assert Workload(tables=w.tables, optimizer="rowwise_adagrad").row_state_values(8) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tables": ()}, "workload.tables is empty"),
        ({"optimizer": "lamb"}, "optimizer='lamb' is unknown"),
        ({"sync_every": 0}, "sync_every=0 must be >= 1"),
        ({"engine": "fast"}, "engine='fast' must be one of"),
        ({"replica_layout": "diagonal"}, "replica_layout='diagonal' must be one of"),
        ({"zipf_exponent": -0.5}, "zipf_exponent=-0.5 must be >= 0"),
    ],
)
def test_bad_workloads_name_the_value(kwargs: dict, match: str) -> None:
    args = {"tables": (TableLoad("a", 10, 8),), **kwargs}
    with pytest.raises(ConfigError, match=match):
        Workload(**args)


def test_bad_table_names_it() -> None:
    with pytest.raises(ConfigError, match="table 'x'"):
        TableLoad("x", 0, 8)
