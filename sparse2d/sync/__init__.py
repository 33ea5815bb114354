"""Replica synchronization: which tensors are averaged, over which group, and when.

``policy`` is the sync itself, top to bottom (``SyncPolicy.step -> _sync -> channel.start ->
all_reduce``: cadence, payloads, NaN/inf vote, averages started, each part landed where it
lands). Around it: ``options`` (``SyncOptions``, ``SyncReport``), ``engines/`` (which values:
dense, touched rows, auto), ``guard`` (the NaN/inf check and vote), ``ballot`` (how a vote of
several flags encodes, carries and reads them), ``shards`` (the FBGEMM shards a sync reads and
writes), ``collectives`` (the plain average and broadcast that alignment and repair use),
``accumulator_scaling`` (momentum scaling) and ``divergence`` (the divergence sample).
Managed-collision tables sync through ``sparse2d.managed_collision``; FULLY_SHARDED, a sharding
strategy, lives in ``sparse2d.core.fully_sharded``.

Nothing is exported here: users configure a sync with ``sparse2d.SyncOptions`` and read
``sparse2d.SyncReport``; the engines, collectives and shard walkers are internals, imported
from the module that defines them (``sync.shards``, ``sync.collectives``, ...).
"""

__all__: list[str] = []
