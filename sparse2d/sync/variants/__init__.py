"""Optional variants of a replica sync, each switched on by a ``SyncOptions`` field:
momentum-scaled row-wise AdaGrad accumulators (``scaling``) and the replica divergence
sample (``divergence``).

Delayed optimizer-state syncs are a transfer that lands later with delta correction
(``sync.transport.transfer``); hidden syncs land before the next lookup (``SyncPolicy``).
"""
