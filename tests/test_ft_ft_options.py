"""``sparse2d.ft.ft_options``: bad values are refused by name before anything connects."""

from __future__ import annotations

import pytest

from sparse2d.errors import ConfigError
from sparse2d.ft import FTOptions


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replica_id": 2, "num_groups": 2}, "replica_id=2 must be in 0..1"),
        ({"replica_id": -1, "num_groups": 2}, "replica_id=-1 must be in 0..1"),
        ({"replica_id": 0, "num_groups": 0}, "num_groups=0 must be a whole number >= 1"),
        ({"replica_id": 0, "num_groups": 2, "min_replica_size": 3}, "min_replica_size=3 exceeds"),
        ({"replica_id": 0, "num_groups": 2, "quorum_every": 0}, "quorum_every=0"),
        ({"replica_id": 0, "num_groups": 2, "timeout_s": 0}, "timeout_s=0 must be > 0"),
        ({"replica_id": 0, "num_groups": 2, "start_wait_s": -1}, "start_wait_s=-1 must be > 0"),
    ],
)
def test_bad_options_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        FTOptions(**kwargs)


def test_lighthouse_address_from_option_or_environment(monkeypatch) -> None:
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    opts = FTOptions(replica_id=0, num_groups=1)
    with pytest.raises(ConfigError, match="needs a lighthouse: set fault_tolerance.lighthouse"):
        opts.lighthouse_address()
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "host:29510")
    assert opts.lighthouse_address() == "http://host:29510"
    assert FTOptions(replica_id=0, num_groups=1, lighthouse="http://a:1").lighthouse_address() == (
        "http://a:1"
    )
    with pytest.raises(ConfigError, match="is not http://HOST:PORT"):
        FTOptions(replica_id=0, num_groups=1, lighthouse="http://nohost").lighthouse_address()


def test_the_retired_overlapped_quorum_is_refused_with_why() -> None:
    """``overlap_quorum`` was retired by measurement: naming it says so, in one line naming
    the section with the run, from the library and from the trainer's config alike."""
    from sparse2d.train.config import load_config

    match = "overlap_quorum was retired: .*section ft-overlap-quorum"
    with pytest.raises(ConfigError, match=rf"^{match}") as info:
        FTOptions(replica_id=0, num_groups=2, overlap_quorum=True)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=rf"^fault_tolerance\.{match}"):
        load_config("configs/ft_tiny_cpu.yaml", ["fault_tolerance.overlap_quorum=true"])
