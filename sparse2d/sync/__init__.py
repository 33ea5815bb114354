"""Replica synchronization: which tensors, which collectives, and when.

One room per concern: ``policy`` (when and how; it composes the rest: ``plan`` of one sync,
``landing`` of the averages in flight), ``options`` (``SyncOptions``, ``SyncReport``),
``shards`` (the FBGEMM shards a sync reads and writes), ``guard`` (the NaN/inf vote),
``ballot`` (how every vote encodes, carries and reads its flags),
``engines/`` (which values), ``transport/`` (how they travel), ``ddp/`` (what rides DDP's
gradient all-reduce), ``accumulator_scaling`` (momentum-scaled AdaGrad accumulators) and
``divergence`` (the replica divergence sample). Managed-collision tables are
``sparse2d.managed_collision``; FULLY_SHARDED is ``sparse2d.core.fully_sharded``.

Nothing is exported here: users configure a sync with ``sparse2d.SyncOptions`` and read
``sparse2d.SyncReport``; the engines, collectives and shard walkers are internals, imported
from the module that defines them (``sync.shards``, ``sync.transport.collectives``, ...).
"""

__all__: list[str] = []
