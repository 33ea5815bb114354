"""``patches.torchrec_hash_mc_modules``: the plain-torch MP-ZCH insert builds tables FBGEMM's
own read-only lookup resolves alike, and CPU MP-ZCH modules train through it."""

from __future__ import annotations

import collections

import pytest
import torch

from sparse2d.patches._base import original_of
from sparse2d.patches.torchrec_hash_mc_modules import (
    apply,
    cpu_kernel_inserts,
    start_slots,
    zch_insert,
)

SIZE = 64
PROBE = 8


def lookup(values: torch.Tensor, identities: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
    """FBGEMM's CPU kernel, read-only, no fallback: -1 for an id it does not find."""
    return torch.ops.fbgemm.zero_collision_hash(
        input=values,
        identities=identities,
        max_probe=PROBE,
        circular_probe=True,
        exp_hours=-1,
        readonly=True,
        disable_fallback=True,
        **kw,
    )[0]


def colliding(count: int, size: int = SIZE) -> torch.Tensor:
    """``count`` ids whose hash starts at the same slot (they fill one probe window)."""
    pool = torch.arange(0, 20_000, dtype=torch.int64)
    starts = start_slots(pool, size, None, None)
    slot = collections.Counter(starts.tolist()).most_common(1)[0][0]
    return pool[starts == slot][:count]


def check_resolves(values: torch.Tensor, identities: torch.Tensor, slots: torch.Tensor) -> None:
    table = identities.view(-1)
    live = table[table != -1]
    assert live.unique().numel() == live.numel(), "an id holds two slots"
    found = lookup(values, identities)
    held = table[slots.clamp(min=0)] == values
    torch.testing.assert_close(found[held], slots[held])  # every inserted id: same slot
    in_table = torch.isin(values, live)
    torch.testing.assert_close(found[~in_table], torch.full_like(found[~in_table], -1))
    torch.testing.assert_close(in_table, found != -1)


def test_cpu_kernel_is_probed_read_only() -> None:
    with pytest.raises(RuntimeError, match="readonly"):
        torch.ops.fbgemm.zero_collision_hash(
            input=torch.tensor([1]),
            identities=torch.full((4, 1), -1, dtype=torch.int64),
            max_probe=4,
            circular_probe=True,
            exp_hours=-1,
            readonly=False,
        )
    assert not cpu_kernel_inserts()


@pytest.mark.parametrize("case", ["random", "collide", "repeat", "extreme"])
def test_insert_matches_fbgemm_lookup(case: str) -> None:
    gen = torch.Generator().manual_seed(3)
    values = {
        "random": torch.randint(0, 10**6, (200,), generator=gen),
        "collide": torch.cat([colliding(3 * PROBE), torch.randint(0, 500, (40,), generator=gen)]),
        "repeat": torch.randint(0, 30, (300,), generator=gen),
        "extreme": torch.tensor([-1, -5, 2**62, -(2**62), 0, 2**63 - 1, -5, 2**62]),
    }[case]
    identities = torch.full((SIZE, 1), -1, dtype=torch.int64)
    slots = torch.cat([zch_insert(v, identities, max_probe=PROBE)[0] for v in values.split(37)])
    if case != "extreme":  # -1 is the empty marker: FBGEMM cannot hold it either
        check_resolves(values, identities, slots)
    else:
        keep = values != -1
        check_resolves(values[keep], identities, slots[keep])
    if case == "collide":  # a full window: later ids fall back to hash % size, not inserted
        ids = colliding(3 * PROBE)
        assert int(torch.isin(identities.view(-1), ids).sum()) == PROBE
        fallback = start_slots(ids[PROBE:], SIZE, None, None)
        torch.testing.assert_close(slots[PROBE : 3 * PROBE], fallback)


def test_insert_with_buckets_matches_fbgemm_lookup() -> None:
    """Per-id local sizes and offsets (TorchRec's bucketed tables)."""
    values = torch.randint(0, 4000, (300,), generator=torch.Generator().manual_seed(5))
    local_sizes = torch.full_like(values, SIZE // 4)
    offsets = (values // 1000) * (SIZE // 4)
    identities = torch.full((SIZE, 1), -1, dtype=torch.int64)
    slots, _ = zch_insert(
        values, identities, max_probe=PROBE, local_sizes=local_sizes, offsets=offsets
    )
    found = lookup(values, identities, local_sizes=local_sizes, offsets=offsets)
    held = identities.view(-1)[slots] == values
    torch.testing.assert_close(found[held], slots[held])
    assert bool((slots >= offsets).all() and (slots < offsets + SIZE // 4).all())


def test_window_longer_than_its_bucket_fills_the_bucket_then_falls_back() -> None:
    """max_probe above a bucket's size: the probe wraps inside the bucket (revisiting slots);
    every slot of the bucket is taken once, FBGEMM's lookup finds each id where it was put,
    and ids past a full bucket fall back without being inserted."""
    bucket = 8
    values = torch.randperm(10**5, generator=torch.Generator().manual_seed(9))[: bucket + 5]
    local_sizes = torch.full_like(values, bucket)
    offsets = torch.full_like(values, 2 * bucket)  # the third bucket
    identities = torch.full((SIZE, 1), -1, dtype=torch.int64)
    slots, _ = zch_insert(
        values, identities, max_probe=4 * bucket, local_sizes=local_sizes, offsets=offsets
    )
    table = identities.view(-1)
    assert int((table != -1).sum()) == bucket and bool((table[2 * bucket : 3 * bucket] != -1).all())
    torch.testing.assert_close(table[slots[:bucket]], values[:bucket])
    found = lookup(
        values[:bucket], identities, local_sizes=local_sizes[:bucket], offsets=offsets[:bucket]
    )
    torch.testing.assert_close(found, slots[:bucket])
    assert not bool(torch.isin(values[bucket:], table).any())


@pytest.mark.parametrize("policy", [0, 1])
def test_insert_with_eviction_matches_fbgemm_lookup(policy: int) -> None:
    """TTL (policy 0) and LRU (policy 1): expired slots are given to newer ids; the evicted
    slots are reported and the lookup still finds every survivor where it is."""
    identities = torch.full((SIZE, 1), -1, dtype=torch.int64)
    metadata = torch.full((SIZE, 1), -1, dtype=torch.int32)
    old = colliding(PROBE + 4)
    stamps = torch.full_like(old, 10, dtype=torch.int32)
    zch_insert(
        old[:PROBE],
        identities,
        max_probe=PROBE,
        metadata=metadata,
        input_metadata=stamps[:PROBE],
        eviction_threshold=11,
        eviction_policy=policy,
    )
    assert int(torch.isin(identities.view(-1), old[:PROBE]).sum()) == PROBE
    new = old[PROBE:]
    slots, evicted = zch_insert(
        new,
        identities,
        max_probe=PROBE,
        metadata=metadata,
        input_metadata=torch.full_like(new, 20, dtype=torch.int32),
        eviction_threshold=11,
        eviction_policy=policy,
    )
    assert evicted is not None and evicted.numel() == new.numel()
    torch.testing.assert_close(evicted, slots.sort().values)
    torch.testing.assert_close(
        metadata.view(-1)[slots], torch.full_like(slots, 20, dtype=torch.int32)
    )
    survivors = torch.cat([old[:PROBE], new])
    in_table = torch.isin(survivors, identities.view(-1))
    assert int(in_table.sum()) == PROBE
    found = lookup(survivors, identities)
    held = found != -1
    torch.testing.assert_close(held, in_table)
    torch.testing.assert_close(identities.view(-1)[found[held]], survivors[held])
    # An unexpired window (threshold below every stamp) evicts nothing: the id falls back.
    again, evicted = zch_insert(
        colliding(PROBE + 6)[-1:],
        identities,
        max_probe=PROBE,
        metadata=metadata,
        input_metadata=torch.tensor([30], dtype=torch.int32),
        eviction_threshold=5,
        eviction_policy=policy,
    )
    assert evicted is not None and evicted.numel() == 0
    assert lookup(colliding(PROBE + 6)[-1:], identities).item() == -1
    del again


def test_eviction_never_duplicates_a_held_id() -> None:
    """An id already in its window is found, never inserted again into an expired slot."""
    identities = torch.full((SIZE, 1), -1, dtype=torch.int64)
    metadata = torch.full((SIZE, 1), -1, dtype=torch.int32)
    ids = colliding(PROBE)
    zch_insert(
        ids,
        identities,
        max_probe=PROBE,
        metadata=metadata,
        input_metadata=torch.full_like(ids, 1, dtype=torch.int32),
        eviction_threshold=5,
    )
    last = ids[-1:]
    slots, evicted = zch_insert(
        last,
        identities,
        max_probe=PROBE,
        metadata=metadata,
        input_metadata=torch.tensor([9], dtype=torch.int32),
        eviction_threshold=5,
    )
    assert evicted is not None and evicted.numel() == 0
    assert int((identities.view(-1) == last).sum()) == 1
    torch.testing.assert_close(lookup(last, identities), slots)


def test_module_trains_through_the_insert_and_evaluates_through_fbgemm() -> None:
    """A TorchRec MP-ZCH module on CPU: training remaps insert here, eval remaps (FBGEMM's
    read-only kernel) find every inserted id in the same slot."""
    from torchrec.modules.hash_mc_evictions import HashZchEvictionConfig, HashZchEvictionPolicyName
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
    from torchrec.sparse.jagged_tensor import JaggedTensor

    module = HashZchManagedCollisionModule(
        zch_size=SIZE,
        device=torch.device("cpu"),
        total_num_buckets=4,
        max_probe=PROBE,
        input_hash_size=4000,
        name="t",
        eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
        eviction_config=HashZchEvictionConfig(features=["f"], single_ttl=1),
    )
    upstream = original_of(HashZchManagedCollisionModule._zero_collision_hash)
    module._zero_collision_hash = upstream.__get__(module)  # TorchRec alone cannot train on CPU
    with pytest.raises(RuntimeError, match="readonly"):
        module({"f": JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([2]))})
    del module._zero_collision_hash
    apply()  # process-wide, as DMPCollection's apply_all does
    values = torch.randint(0, 4000, (120,), generator=torch.Generator().manual_seed(9))
    feature = {"f": JaggedTensor(values=values, lengths=torch.tensor([60, 60]))}
    trained = module(feature)["f"].values()
    assert int((module._hash_zch_identities != -1).sum()) > 0
    assert bool((module._hash_zch_metadata[module._hash_zch_identities != -1] > 0).all())
    module.eval()
    looked_up = module(feature)["f"].values()
    held = module._hash_zch_identities.view(-1)[trained] == values
    assert bool(held.any()) and not bool(held.all())  # some ids fell back: windows filled
    torch.testing.assert_close(looked_up[held], trained[held])
