"""What every forked test rank imports, loaded once in the forkserver the ranks fork from.

A spawned interpreter spends ~6 CPU-seconds importing torch, TorchRec, FBGEMM and torchft;
the fault-tolerance tests start 2-4 fresh ranks per check, on 2 cores ~10 s of wall time
each. The ranks (``tests.harness``, ``tests.ft_groups``) start from a forkserver that
imported these modules once. It has run nothing else: one thread, no OpenMP pool, no
process group, so a fork of it is as clean as a new interpreter. Each rank still sets its
own environment, thread count and process group.
"""

from __future__ import annotations

import torch  # noqa: F401
import torch.distributed  # noqa: F401
import torchft  # noqa: F401
import torchrec  # noqa: F401

import sparse2d.core.collection  # noqa: F401
import sparse2d.ft  # noqa: F401
import tests.models  # noqa: F401
