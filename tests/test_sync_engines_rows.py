"""``sync.engines.rows``: selected rows packed into one buffer per dtype and written back."""

from __future__ import annotations

import pytest
import torch

from sparse2d.errors import ConfigError
from sparse2d.sync.engines.base import BufferPool
from sparse2d.sync.engines.rows import row_bytes, row_payload


def test_selected_rows_round_trip_per_dtype_with_a_tail() -> None:
    weight = torch.arange(12.0).view(6, 2)  # element-wise rows (rows, cols)
    state = torch.arange(6.0)  # row-wise optimizer state (rows,)
    half = torch.arange(8, dtype=torch.float16).view(4, 2)
    rows = torch.tensor([1, 4])
    landed: list[torch.Tensor] = []
    payload = row_payload(
        [(weight, rows), (state, rows), (half, None)],
        tail=torch.tensor([7.0]),
        on_tail=landed.append,
        pool=(BufferPool(), "k"),
    )
    fp32, fp16 = payload.buffers
    assert fp32.tolist() == [2.0, 3.0, 8.0, 9.0, 1.0, 4.0, 7.0]  # rows, then state, then tail
    assert torch.equal(fp16, half.reshape(-1)) and payload.bytes == 7 * 4 + 8 * 2
    payload.scatter([fp32 * 10, fp16 * 2])
    assert weight[1].tolist() == [20.0, 30.0] and weight[0].tolist() == [0.0, 1.0]
    assert state.tolist() == [0.0, 10.0, 2.0, 3.0, 40.0, 5.0]  # untouched rows kept
    assert torch.equal(half, torch.arange(8, dtype=torch.float16).view(4, 2) * 2)
    assert landed[0].tolist() == [70.0]  # the tail is handed back, never written to a shard
    again = payload.gather()  # fresh copies of the live values at the same positions
    assert again[0][:4].tolist() == [20.0, 30.0, 80.0, 90.0]
    assert row_bytes(weight) == 8 and row_bytes(state) == 4


def test_a_tail_without_an_fp32_buffer_is_refused() -> None:
    half = torch.zeros(4, 2, dtype=torch.float16)
    with pytest.raises(ConfigError, match="tail rides on the fp32 buffer"):
        row_payload([(half, None)], tail=torch.zeros(1))
