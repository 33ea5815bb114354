"""Optional variants of a replica sync, each switched on by a ``SyncOptions`` field:
momentum-scaled row-wise AdaGrad accumulators (``scaling``) and the replica divergence
sample (``divergence``).

Delayed optimizer-state syncs land at the next sync with delta correction, hidden syncs
before the next lookup: both are the policy's (``sync.policy.InFlight``).
"""
