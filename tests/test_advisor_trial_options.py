"""What the measured ``auto`` is told (sparse2d.advisor.trial_options): each field's range,
refused naming the field alone, and under ``parallel.auto.`` when the trainer loads YAML."""

from __future__ import annotations

import pytest

from sparse2d.advisor.trial_options import TrialOptions
from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("candidates", -1),
        ("candidates", 65),
        ("margin", -0.1),
        ("warmup_steps", -1),
        ("timed_steps", 0),
        ("timed_steps", 2.5),
        ("candidates", True),
        ("retrial_margin", -0.1),
        ("retrial_margin", "0.1"),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}={value!r} must be"):
        TrialOptions(**{key: value})  # type: ignore[arg-type]


def test_the_trainer_section_is_trial_options_and_names_the_dotted_key() -> None:
    auto = load_config("configs/tiny_cpu.yaml", ["parallel.auto.margin=2"]).parallel.auto
    assert type(auto) is TrialOptions and auto == TrialOptions(margin=2.0)
    with pytest.raises(ConfigError, match=r"^parallel\.auto\.timed_steps=0 must be an integer"):
        load_config("configs/tiny_cpu.yaml", ["parallel.auto.timed_steps=0"])
