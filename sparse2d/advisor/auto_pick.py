"""``sharding_group_size="auto"``: ask the advisor for ``L`` from a live model and process group.

The workload is read off the module (every ``EmbeddingBagCollection``/``EmbeddingCollection``
table, the fused optimizer set by ``apply_optimizer_in_backward``, the dense parameters) and
the topology from the device and ``LOCAL_WORLD_SIZE``. Rank 0 decides and broadcasts the
answer (or the advisor's error) so every rank builds the same mesh, as ``plan_for_group`` does.
``pick_group_size`` then measures the shortlist where it can
(``sparse2d.advisor.embedding_trial``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparse2d.advisor.topology import ClusterTopology, load_topology
from sparse2d.advisor.trial_options import TrialOptions
from sparse2d.advisor.workload import TableLoad, Workload

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    import torch.nn as nn


AUTO = "auto"
DEFAULT_BATCH_SIZE = 512
"""Per-rank batch assumed when the caller gives no ``planner_batch_size`` (TorchRec's default)."""


def _optimizer_kind(module: nn.Module) -> str:
    import torch
    from torchrec.optim import RowWiseAdagrad

    kinds = {
        torch.optim.SGD: "sgd",
        torch.optim.Adagrad: "adagrad",
        RowWiseAdagrad: "rowwise_adagrad",
        torch.optim.Adam: "adam",
    }
    for parameter in module.parameters():
        for cls in getattr(parameter, "_optimizer_classes", []):
            if cls in kinds:
                return kinds[cls]
    return "rowwise_adagrad"  # unknown: assume one state value per row


def workload_from_module(
    module: nn.Module,
    batch_size_per_rank: int | None = None,
    sync_options: Any = None,
    replica_layout: str = "intra_host",
    constraints: dict[str, Any] | None = None,
) -> Workload:
    """The advisor's view of ``module`` (works on ``meta``); a constraint naming exactly one
    sharding type forces it, as it forces TorchRec's planner."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    tables, embedding_params = [], set()
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            configs = sub.embedding_bag_configs()
        elif isinstance(sub, EmbeddingCollection):
            configs = sub.embedding_configs()
        else:
            continue
        embedding_params.update(id(p) for p in sub.parameters())
        for c in configs:
            types = getattr((constraints or {}).get(c.name), "sharding_types", None) or []
            forced = types[0] if len(types) == 1 else None
            tables.append(
                TableLoad(
                    c.name, c.num_embeddings, c.embedding_dim, len(c.feature_names), 1.0, forced
                )
            )
    dense = sum(p.numel() for p in module.parameters() if id(p) not in embedding_params)
    if sync_options is None:  # what the collection syncs with when given none
        from sparse2d.sync.options import SyncOptions

        sync_options = SyncOptions()
    engine = getattr(sync_options, "engine", "dense")
    return Workload(
        tables=tuple(tables),
        batch_size_per_rank=batch_size_per_rank or DEFAULT_BATCH_SIZE,
        optimizer=_optimizer_kind(module),  # type: ignore[arg-type]
        sync_every=getattr(sync_options, "every", 1),
        include_optimizer_state=getattr(sync_options, "include_optimizer_state", True),
        engine=engine,
        replica_layout=replica_layout,  # type: ignore[arg-type]
        dense_params=dense,
    )


TOPOLOGY_ENV = "SPARSE2D_TOPOLOGY"
"""A topology YAML (``sparse2d.advisor.topology``) that describes this job's cluster better than
the device's preset: its hosts, links and memory. ``launch/emulated_hosts.sh`` writes one per
run (``RUN_DIR/topology.yaml``: the emulated hosts, their cores, each host's link) and sets it."""


def topology_for_device(device: torch.device, world_size: int) -> ClusterTopology:
    """The cluster ``$SPARSE2D_TOPOLOGY`` describes where set; else ``h100_8x`` sized to this
    GPU's memory on CUDA, the fitted ``cpu_gloo`` on CPU with this host's cores (its
    constants are per core)."""
    if os.environ.get(TOPOLOGY_ENV):
        return load_topology(os.environ[TOPOLOGY_ENV], world_size)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None
    if device.type == "cuda":
        import torch

        memory = torch.cuda.get_device_properties(device).total_memory
        per_host = local or max(1, torch.cuda.device_count())
        overrides = [f"device_memory_bytes={memory}", f"ranks_per_host={per_host}"]
        return load_topology("h100_8x", world_size, overrides)
    cores = os.cpu_count() or 1  # the host's, not this rank's affinity (ranks may be pinned)
    overrides = [f"ranks_per_host={local or world_size}", f"cores_per_host={cores}"]
    return load_topology("cpu_gloo", world_size, overrides)


def auto_candidates(
    workload: Callable[[], Workload],
    world_size: int,
    device: torch.device,
    pg: dist.ProcessGroup,
    options: TrialOptions | None = None,
) -> tuple[int, list[tuple[int, float]]]:
    """The advisor's ``L`` for the job ``workload()`` describes (called on rank 0 only) and
    its shortlist (``(L, predicted s)``, the pick first, ``options`` as the trainer's),
    decided on rank 0 of ``pg`` and broadcast to all; ``NoFitError`` on every rank when
    nothing fits."""
    from sparse2d.advisor.search import advise, no_fit_message
    from sparse2d.advisor.trial import shortlist
    from sparse2d.comm_device import share_from_rank0
    from sparse2d.errors import NoFitError

    def decide() -> tuple[int, list[tuple[int, float]]]:
        job = workload()
        topology = topology_for_device(device, world_size)
        advice = advise(job, topology)
        if advice.recommended is None:
            raise NoFitError(no_fit_message(advice, job, topology))
        return advice.recommended, shortlist(advice, options or TrialOptions())

    pick, candidates = share_from_rank0(decide, pg)
    return int(pick), [(int(L), float(s)) for L, s in candidates]
