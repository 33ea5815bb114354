"""The streamed sync (``SyncOptions.stream``): fragments, and what a stream leaves in the
tables against references written by hand from the semantics (``sparse2d.sync.stream``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sparse2d.sync.options import SyncOptions
from sparse2d.sync.shards import ShardState
from sparse2d.sync.stream import split_rows

STEPS = 7


def _shards(rows: list[int], cols: int = 4, states: bool = True) -> list[ShardState]:
    out = []
    for i, n in enumerate(rows):
        state = [torch.zeros(n)] if states else []
        out.append(ShardState(f"t{i}", 0, 0, torch.zeros(n, cols), state))
    return out


def test_fragments_cover_every_row_once_in_about_equal_bytes() -> None:
    shards = _shards([10, 3, 17, 1, 9])
    row = (4 + 1) * 4  # a row's bytes: its weight and its row-wise state
    total = 40 * row
    for count in (1, 2, 3, 7, 40):
        fragments = split_rows(shards, count)
        assert len(fragments) == count
        seen = [torch.zeros(s.rows, dtype=torch.int64) for s in shards]
        for spans in fragments:
            size = 0
            for span in spans:
                seen[span.shard][span.start : span.end] += 1
                size += (span.end - span.start) * row
            # within one row of an equal share
            assert abs(size - total / count) <= row, (count, size)
        assert all(bool((s == 1).all()) for s in seen), count


def test_more_fragments_than_rows_leaves_some_empty() -> None:
    fragments = split_rows(_shards([2, 1]), 5)
    assert sum(1 for f in fragments if f) == 3
    assert sorted((s.shard, s.start) for f in fragments for s in f) == [(0, 0), (0, 1), (1, 0)]


def _live(model) -> list[torch.Tensor]:  # noqa: ANN001
    out = []
    for shard in model.shard_states:
        out += [shard.weight, *shard.optimizer_states]
    return out


def _rows(model, spans) -> list[torch.Tensor]:  # noqa: ANN001
    """Views of the fragment's rows: each span's weight rows, then its states' rows."""
    views = []
    for span in spans:
        shard = model.shard_states[span.shard]
        for tensor in [shard.weight, *shard.optimizer_states]:
            views.append(tensor[span.start : span.end])
    return views


def _average(tensors: list[torch.Tensor], pg: dist.ProcessGroup) -> list[torch.Tensor]:
    out = []
    for tensor in tensors:
        copy = tensor.clone()
        dist.all_reduce(copy, dist.ReduceOp.AVG, group=pg)
        out.append(copy)
    return out


def check_stream_against_hand(
    every: int, hide: bool, momentum: bool, engine: str = "dense"
) -> list[float]:
    """A streamed policy on one model; on an identical one, the semantics by hand: after step
    ``s`` fragment ``s % every``'s rows are averaged over the replicas; hidden, that average
    lands after the next step as ``avg(sent) + (live - sent)``; with momentum scaling each
    landed accumulator row becomes ``ref + (avg - ref) / replicas`` (plus, hidden, its own
    ``live - sent``), the same reference on every replica. Bit for bit. Then a full sync:
    replicas identical (with the updates folded into the reference they were not)."""
    from sparse2d.sync.policy import SyncPolicy
    from tests.models import SPARSE_SYNC_TABLES, train
    from tests.test_sync_engines_sparse import _assert_same, _model

    streamed, by_hand = (_model(SPARSE_SYNC_TABLES, "rowwise_adagrad") for _ in range(2))
    options = SyncOptions(
        every=every, hide=hide, stream=True, momentum_scaling=momentum, engine=engine
    )
    policy = SyncPolicy(streamed.shard_states, streamed.replica_pg, streamed.num_replicas, options)
    train(streamed, SPARSE_SYNC_TABLES, STEPS, after_step=policy.step)
    policy.finish()

    pg, replicas = by_hand.replica_pg, by_hand.num_replicas
    fragments = split_rows(by_hand.shard_states, every)
    refs = [s.optimizer_states[0].clone() for s in by_hand.shard_states]
    pending: list = []  # (spans, sent, averaged)

    def land(spans, sent, averaged) -> None:  # noqa: ANN001
        views = _rows(by_hand, spans)
        with torch.no_grad():
            meanwhile = [view - s for view, s in zip(views, sent, strict=True)]
            for view, a in zip(views, averaged, strict=True):
                view.copy_(a)
            if momentum:
                for span in spans:
                    acc = by_hand.shard_states[span.shard].optimizer_states[0]
                    rows, ref = acc[span.start : span.end], refs[span.shard]
                    scaled = ref[span.start : span.end] + (rows - ref[span.start : span.end]) / (
                        float(replicas)
                    )
                    rows.copy_(scaled)
                    ref[span.start : span.end] = scaled
            if hide:
                for view, d in zip(views, meanwhile, strict=True):
                    view.add_(d)

    def hand_step(step: int) -> None:
        while pending:
            land(*pending.pop())
        spans = fragments[step % every] if every > 1 else None
        if spans is None:  # every: 1 is the ordinary sync of every row
            spans = [
                type(f)(f.shard, 0, by_hand.shard_states[f.shard].rows)
                for f in split_rows(by_hand.shard_states, 1)[0]
            ]
        sent = [v.clone() for v in _rows(by_hand, spans)]
        averaged = _average(sent, pg)
        if hide and every > 1:
            pending.append((spans, sent, averaged))
        else:
            land(spans, sent, averaged)

    train(by_hand, SPARSE_SYNC_TABLES, STEPS, after_step=hand_step)
    while pending:
        land(*pending.pop())
    _assert_same(streamed, by_hand)
    diffs = []
    for a, b in zip(_live(streamed), _live(by_hand), strict=True):
        diffs.append(float((a - b).abs().max()))
    policy.sync_now()
    for a, b in zip(_live(streamed), _average(_live(streamed), pg), strict=True):
        diffs.append(float((a - b).abs().max()))  # every replica holds the average
    policy.close()
    return diffs


@pytest.mark.parametrize(
    ("every", "hide", "momentum", "engine"),
    [
        (1, True, False, "dense"),
        (3, True, False, "dense"),
        (3, False, False, "dense"),
        (4, True, True, "dense"),
        (2, False, True, "dense"),
        (3, True, False, "sparse"),
        (4, True, True, "auto"),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v),
)
def test_a_stream_equals_its_semantics_by_hand(
    world4, every: int, hide: bool, momentum: bool, engine: str
) -> None:
    for diffs in world4.run(check_stream_against_hand, every, hide, momentum, engine):
        assert max(diffs) == 0.0


def check_save_under_a_stream(root: str, engine: str) -> list[float]:
    """Mid-stream the replicas differ; ``checkpoint.save`` averages every row first, so the
    copy written is the replicas' average, and a fresh model loads exactly that. With a
    touched-rows engine that full sync must send every row touched since the last full
    sync, not since the last fragment's (it did: rows stayed apart)."""
    from sparse2d import DMPCollection, checkpoint
    from tests.models import SPARSE_SYNC_TABLES, build_model, constraints_for, train
    from tests.test_sync_engines_sparse import OPTIMIZERS

    def model() -> DMPCollection:
        cls, kwargs = OPTIMIZERS["rowwise_adagrad"]
        module = build_model(SPARSE_SYNC_TABLES, optimizer=cls, **kwargs)
        options = SyncOptions(every=3, stream=True, engine=engine)
        return DMPCollection(
            module,
            2,
            device="cpu",
            constraints=constraints_for(SPARSE_SYNC_TABLES),
            sync_options=options,
        )

    streamed = model()
    train(streamed, SPARSE_SYNC_TABLES, 4, after_step=streamed.maybe_sync)
    streamed.finish_sync()
    average = _average(_live(streamed), streamed.replica_pg)
    apart = max(float((a - b).abs().max()) for a, b in zip(_live(streamed), average))
    checkpoint.save(root, streamed, step=4)
    after = max(float((a - b).abs().max()) for a, b in zip(_live(streamed), average))
    fresh = model()
    checkpoint.load(root, fresh)
    loaded = max(float((a - b).abs().max()) for a, b in zip(_live(fresh), average))
    for m in (streamed, fresh):
        m.close()
    return [apart, after, loaded]


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_a_save_under_a_stream_writes_the_replicas_average(world4, tmp_path, engine) -> None:
    for apart, after, loaded in world4.run(check_save_under_a_stream, str(tmp_path), engine):
        assert apart > 0  # mid-stream the replicas differ ...
        assert after < 1e-6 and loaded < 1e-6  # ... the save writes (and leaves) their average
