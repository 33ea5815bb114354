"""Replica synchronization: which tensors are averaged, over which group, and when.

``policy`` is the sync, top to bottom; the rest serve it (docs/architecture.md walks them).
Nothing is exported here: users configure a sync with ``sparse2d.SyncOptions`` and read
``sparse2d.SyncReport``.
"""

__all__: list[str] = []
