"""``sync.engines.base`` helpers without a process group: flat views over live shards,
buffer pool."""

from __future__ import annotations

import torch

from sparse2d.sync.engines import base as engine
from sparse2d.sync.engines.base import BufferPool, flat_views, in_place_payload


def test_flat_views_merge_adjacent_tensors_of_one_storage() -> None:
    flat = torch.arange(20.0)
    a, b = flat[:8].view(4, 2), flat[8:20].view(6, 2)  # two tables of one fused kernel
    other = torch.zeros(3)
    views = flat_views([b, a, other])  # order does not matter
    assert views is not None and len(views) == 2
    assert torch.equal(views[0], flat) and views[0].data_ptr() == flat.data_ptr()
    views[0].add_(1)  # writes reach the live tensors
    assert torch.equal(a.reshape(-1), torch.arange(1.0, 9.0))


def test_flat_views_refuse_gaps_overlaps_and_strides() -> None:
    flat = torch.zeros(20)
    assert flat_views([flat[:8], flat[10:20]]) is None  # rows between them are not synced
    assert flat_views([flat[:8], flat[4:12]]) is None  # overlap would be averaged twice
    assert flat_views([torch.zeros(4, 4).t()]) is None  # not contiguous


def test_in_place_payload_only_from_the_size_threshold(monkeypatch) -> None:
    tensors = [torch.ones(4), torch.ones(4)]
    assert in_place_payload(tensors) is None  # 32 bytes: copying is cheaper than waiting
    monkeypatch.setattr(engine, "IN_PLACE_MIN_BYTES", 0)
    payload = in_place_payload(tensors)
    assert payload is not None and payload.in_place and len(payload.buffers) == 2
    payload.buffers[0].mul_(3)
    payload.scatter(payload.buffers)  # nothing to write back
    assert tensors[0].tolist() == [3.0] * 4
    assert payload.gather()[0].data_ptr() != tensors[0].data_ptr()  # gather copies


def test_buffer_pool_reuses_and_grows() -> None:
    pool = BufferPool()
    first = pool.take("k", 10, torch.float32, torch.device("cpu"))
    again = pool.take("k", 6, torch.float32, torch.device("cpu"))
    assert again.data_ptr() == first.data_ptr() and again.numel() == 6
    bigger = pool.take("k", 12, torch.float32, torch.device("cpu"))
    assert bigger.numel() == 12 and bigger.data_ptr() != first.data_ptr()
    other = pool.take("j", 6, torch.float32, torch.device("cpu"))
    assert other.data_ptr() != bigger.data_ptr()  # keys never share a buffer
