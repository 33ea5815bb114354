"""``bench/cuda_check.py`` reads a GPU check's logs as ``bench/gpu/check.sh`` writes them."""

from __future__ import annotations

import json
from pathlib import Path

from bench.cuda_check import FINDINGS, parse_run, render

SMOKE = {
    "python": "3.12.3",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "nccl": "2.28.9",
    "gpu": "NVIDIA H100 80GB HBM3",
    "fbgemm_gpu": "1.6.0",
    "torchrec": "1.6.1",
    "torchft": "?",
    "fbgemm_cumsum": [0, 1, 3],
    "gloo_on_cuda": {"all_reduce": "ok", "reduce_scatter_tensor": "RuntimeError: no"},
}


def test_logs_become_the_section(tmp_path: Path) -> None:
    (tmp_path / "smoke.log").write_text("WARNING: noise\n" + json.dumps(SMOKE) + "\n")
    (tmp_path / "equivalence.log").write_text(
        "tests/test_core_collection.py::test_a PASSED\n==== 13 passed, 1 failed in 80.2s ====\n"
    )
    (tmp_path / "train_cuda.log").write_text(
        "[start] world_size=1 device=cuda:0\n[train] step=50 train_loss=0.4\n"
        "final step=300 eval_auc=0.87 samples/s=90000.0\n"
    )
    (tmp_path / "train_cpu.log").write_text(
        "Traceback...\nsparse2d.train: rank 0: RuntimeError: No backend type\n"
    )
    run = parse_run(tmp_path)
    assert run["smoke"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert run["equivalence"]["summary"] == "13 passed, 1 failed"
    assert run["train_cuda"]["final"] == "step=300 eval_auc=0.87 samples/s=90000.0"
    assert run["train_cuda"]["last_logged_step"] == 50
    assert run["train_cpu"]["error"] == "RuntimeError: No backend type"
    assert run["equivalence"]["progress"] == "."
    text = render({"sessions": [{"label": "A session", "runs": [run]}], "findings": FINDINGS})
    assert "### A session" in text
    assert "all_reduce ok; reduce_scatter_tensor: RuntimeError: no." in text
    assert "| call 1 | trainer, cuda | ran: step=300" in text
    assert "| call 1 | trainer, cpu | failed: `RuntimeError: No backend type`" in text
    assert "13 passed, 1 failed" in text


def test_quiet_logs_modules_and_the_cpu_benchmark(tmp_path: Path) -> None:
    """A -q diagnostic call (traceback ``E`` lines are not progress), a -v module run, and
    ft_bench's JSON: each becomes a row or the paragraph on the machine's CPU cores."""
    (tmp_path / "eq.log").write_text("F\nE               \nE   ValueError: x\n1 failed in 66.4s\n")
    (tmp_path / "more.log").write_text(
        "tests/test_sync_mc.py::test_a FAILED [ 10%]\ntests/test_core_group_refs.py::test_b PASSED\n"
        "FAILED tests/test_sync_mc.py::test_a\n==== 1 failed, 1 passed in 9.0s ====\n"
    )
    (tmp_path / "ft").mkdir()
    launch = {"samples_per_s": 50000.0, "vote_wait_ms_per_step": 0.5}
    ft_launch = {**launch, "quorum_wait_ms_per_step": 0.2, "echo_wait_ms_per_step": 0.02}
    (tmp_path / "ft" / "ft_pipeline.json").write_text(
        json.dumps(
            {
                "clean": {"ft": [ft_launch], "std": [{"samples_per_s": 51200.0}]},
                "pipeline": "sparse_dist",
                "machine": "16 cores",
            }
        )
    )
    run = parse_run(tmp_path)
    assert run["equivalence"] == {"summary": "1 failed", "progress": "F", "timeouts": 0}
    assert run["modules"][0]["failed"] == ["tests/test_sync_mc.py::test_a"]
    text = render({"sessions": [{"label": "B", "runs": [run]}], "findings": FINDINGS})
    assert "test_core_group_refs.py, test_sync_mc.py | 1 failed, 1 passed" in text
    assert "by module: test_sync_mc.py 1" in text
    assert "50000 vs 51200 (0.977); ratio of the means **0.977**" in text
    assert "a step is 10 ms here" in text
