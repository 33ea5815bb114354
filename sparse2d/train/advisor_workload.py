"""The advisor's plain view of a trainer config (``sparse2d.advisor.workload.Workload``):
read by ``sparse2d plan``, the trainer's ``auto`` pick and the loop's balance record."""

from __future__ import annotations

from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.train.config import Config


def dense_params(cfg: Config) -> int:
    """Parameters of the DLRM MLPs (and DCN cross layers): the data-parallel part."""
    m = cfg.model
    features = len(m.feature_names)
    dim = m.dense_arch[-1]

    def mlp(inputs: int, sizes: list[int]) -> int:
        total = 0
        for size in sizes:
            total += inputs * size + size
            inputs = size
        return total

    if m.arch == "dlrm_dcn":
        over_in = (features + 1) * dim
        cross = m.dcn_num_layers * (2 * over_in * m.dcn_low_rank_dim + over_in)
    else:
        over_in = dim + features * (features + 1) // 2
        cross = 0
    return mlp(m.dense_in_features, list(m.dense_arch)) + cross + mlp(over_in, list(m.over_arch))


def workload_from_config(cfg: Config) -> Workload:
    """The advisor's plain view of a trainer config."""
    synthetic = cfg.data.source == "synthetic"
    pooling = (cfg.data.synthetic.ids_per_feature + 1) / 2 if synthetic else 1.0
    sync = cfg.parallel.sync
    return Workload(
        tables=tuple(
            TableLoad(t.name, t.rows, t.dim, len(t.features), pooling, t.sharding)
            for t in cfg.model.specs()
        ),
        batch_size_per_rank=cfg.data.batch_size_per_rank,
        optimizer=cfg.optimizer.sparse.kind,
        sync_every=sync.every,
        include_optimizer_state=sync.include_optimizer_state,
        engine=sync.engine,
        zipf_exponent=cfg.data.synthetic.zipf_exponent if synthetic else 1.1,
        replica_layout=cfg.parallel.replica_layout,
        sharding_strategy=cfg.parallel.sharding_strategy,
        dense_params=dense_params(cfg),
        pipeline=cfg.train.pipeline != "none",
        hide=sync.hide,
        check_finite=sync.check_finite,
        stream=sync.stream,
    )
