"""Replica synchronization: which tensors, which collectives, and when.

Nothing is exported here: users configure a sync with ``sparse2d.SyncOptions`` and read
``sparse2d.SyncReport``; the engines, collectives and shard walkers are internals, imported
from the module that defines them (``sync.shards``, ``sync.transport.collectives``, ...).
"""

__all__: list[str] = []
