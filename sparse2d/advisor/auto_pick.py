"""``sharding_group_size="auto"``: the cost model's ``L`` for a live model and process group.

The workload is read off the module (every ``EmbeddingBagCollection``/``EmbeddingCollection``
table, the fused optimizer set by ``apply_optimizer_in_backward``, the dense parameters) and
the topology from the device and ``LOCAL_WORLD_SIZE``. Rank 0 decides and broadcasts the
answer (or the advisor's error) so every rank builds the same mesh, as ``plan_for_group`` does.
``pick_group_size`` is that answer for ``DMPCollection(module, "auto")`` (the public door asks
it in step 2 of the construction, ``sparse2d.public_collection``); the trainer asks ``decide``
with its config's workload.

Until issue 66 the shortlist was then measured by a trial of timed steps; the stored runs
(``bench/RESULTS.md``, section ``auto``) found the model's pick as close to the best fixed
``L`` and seconds cheaper, so the trial and its options were retired (``RETIRED``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparse2d.advisor.topology import ClusterTopology, load_topology
from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.errors import ConfigError, KeyValueError, NoFitError

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from sparse2d.core.collection_setup import Setup

logger = logging.getLogger(__name__)


AUTO = "auto"
RETIRED = (
    "the measured trial of sharding_group_size auto (timed steps of each L the cost model "
    "shortlisted) came no closer to the best fixed L than the model's pick and cost seconds "
    "per launch: bench/RESULTS.md, section auto, gives the runs. Drop it: auto is the cost "
    "model's pick"
)
"""Why the trial's options went (issue 66): the door's ``auto_options`` and the trainer's
``parallel.auto`` are refused with this line, never ignored."""
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


@dataclass(frozen=True, slots=True)
class AutoPick:
    """The cost model's answer: ``L``, the replica layout it was priced in, and the predicted
    step (seconds) of every ``L`` that fits device memory."""

    sharding_group_size: int
    replica_layout: str
    predicted_s: dict[int, float]

    def line(self) -> str:
        """The log line: the pick, said to be the model's, and its predicted step per ``L``."""
        steps = ", ".join(f"L={L} {1e3 * s:.1f} ms" for L, s in sorted(self.predicted_s.items()))
        return (
            f"auto sharding_group_size={self.sharding_group_size} ({self.replica_layout}): "
            f"the cost model's pick; predicted step {steps}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "sharding_group_size": self.sharding_group_size,
            "replica_layout": self.replica_layout,
            "method": "model",
            "predicted_step_s": {str(L): s for L, s in sorted(self.predicted_s.items())},
        }


def decide(
    workload: Workload, topology: ClusterTopology, group_size: int | None = None
) -> AutoPick:
    """The advisor's recommended ``L`` (or ``group_size`` when given: only its layout is asked
    for); ``NoFitError`` when nothing fits. Pure: run it on rank 0 (``share_from_rank0``)."""
    from sparse2d.advisor.search import advise, no_fit_message

    advice = advise(workload, topology)
    if group_size is None:
        if advice.recommended is None:
            raise NoFitError(no_fit_message(advice, workload, topology))
        group_size = advice.recommended
    return AutoPick(
        group_size,
        advice.candidate(group_size).replica_layout,
        {c.sharding_group_size: c.step_s for c in advice.candidates if c.fits},
    )


def refuse_retired(kwargs: dict[str, Any]) -> None:
    """``auto_options`` (the retired trial's options) is refused naming it, never ignored."""
    if "auto_options" in kwargs:
        raise KeyValueError("auto_options", f" was retired: {RETIRED}.")


def pick_group_size(module: nn.Module, **kwargs: Any) -> int:
    """The ``L`` that ``DMPCollection(module, "auto", **kwargs)`` builds: the cost model's pick.

    ``kwargs`` are the constructor's keywords (``device``, ``constraints``, ``sharders``,
    ``replica_layout``, ``global_pg``, ``planner_batch_size``, ``sync_options``, ...), checked
    as the constructor checks them before any collective. Collective over ``global_pg`` (rank 0
    decides, all receive): the same ``L`` on every rank. ``module`` is not sharded.
    """
    from sparse2d.core.collection_setup import resolve_setup

    refuse_retired(kwargs)
    size = kwargs.pop("sharding_group_size", AUTO)
    if size != AUTO:
        raise ConfigError(
            f"pick_group_size chooses sharding_group_size; got sharding_group_size={size!r}."
        )
    return choose_group_size(
        module, resolve_setup(module, (), kwargs | {"sharding_group_size": AUTO})
    )


def choose_group_size(module: nn.Module, setup: Setup) -> int:
    """``pick_group_size`` for a call validated by the core's step 1 (``resolve_setup``):
    rank 0 decides, all receive, rank 0 logs the line; the chosen ``L`` is checked by the
    construction's step 2."""
    from sparse2d.comm_device import share_from_rank0

    call = setup.call

    def decide_here() -> AutoPick:
        job = workload_from_module(
            module,
            call.planner_batch_size,
            call.sync_options,
            setup.replica_layout,
            call.constraints,
        )
        return decide(job, topology_for_device(setup.device, setup.world_size))

    pick: AutoPick = share_from_rank0(decide_here, setup.pg)
    if setup.rank == 0:
        logger.info("[sparse2d] %s", pick.line())
    return pick.sharding_group_size
