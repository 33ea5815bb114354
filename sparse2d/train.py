"""The trainer: ``python -m sparse2d.train --config configs/NAME.yaml [dotted.key=value ...]``.

Launched by ``torchrun`` (see ``launch/``). Builds TorchRec's DLRM over an
``EmbeddingBagCollection`` on ``meta``, shards it with ``DMPCollection`` (groups of
``parallel.sharding_group_size`` ranks, replicated), trains with the fused sparse
optimizer and a dense torch optimizer, syncs replicas on the configured cadence,
evaluates, and writes ``RUN_DIR/metrics.jsonl`` and ``RUN_DIR/summary.json``.
Any rank's failure prints one line (``sparse2d.train: rank R: ...``; a traceback only
for unexpected errors) and exits 1, which makes torchrun stop the other ranks.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import logging
import os
import socket
import sys
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.config import Config, load_config
from sparse2d.errors import ConfigError

SPARSE_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _single_process_env() -> None:
    """Let ``python -m sparse2d.train`` run without torchrun (world of one)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip


def resolve_device(cfg: Config) -> torch.device:
    """The config's ``device`` (``auto``: this rank's GPU when CUDA is available, else cpu)."""
    from sparse2d.validation import resolve_device as resolve

    return resolve(None if cfg.device == "auto" else cfg.device)


def build_model(cfg: Config, device: torch.device) -> torch.nn.Module:
    """TorchRec ``DLRMTrain(DLRM)``: tables on ``meta``, dense layers on ``device``."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.optim import RowWiseAdagrad

    m = cfg.model
    torch.manual_seed(m.init_seed)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.dim,
                num_embeddings=t.rows,
                feature_names=list(t.features),
                pooling=PoolingType.SUM if t.pooling == "sum" else PoolingType.MEAN,
            )
            for t in m.specs()
        ],
        device=torch.device("meta"),
    )
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=m.dense_in_features,
        dense_arch_layer_sizes=list(m.dense_arch),
        over_arch_layer_sizes=list(m.over_arch),
        dense_device=device,
    )
    if m.arch == "dlrm_dcn":
        dlrm = DLRM_DCN(
            **common, dcn_num_layers=m.dcn_num_layers, dcn_low_rank_dim=m.dcn_low_rank_dim
        )
    else:
        dlrm = DLRM(**common)
    sparse = cfg.optimizer.sparse
    cls, kwargs = {
        "sgd": (torch.optim.SGD, {"lr": sparse.lr}),
        "adagrad": (torch.optim.Adagrad, {"lr": sparse.lr, "eps": sparse.eps}),
        "rowwise_adagrad": (RowWiseAdagrad, {"lr": sparse.lr, "eps": sparse.eps}),
    }[sparse.kind]
    _apply_optimizer_in_backward(cls, dlrm.sparse_arch.parameters(), kwargs)
    return DLRMTrain(dlrm)


def dense_optimizer(cfg: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    d = cfg.optimizer.dense
    if d.kind == "sgd":
        return torch.optim.SGD(params, lr=d.lr)
    if d.kind == "adam":
        return torch.optim.Adam(params, lr=d.lr, eps=d.eps)
    return torch.optim.Adagrad(params, lr=d.lr, eps=d.eps)


def shard(cfg: Config, module: torch.nn.Module, device: torch.device, world: int) -> Any:
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection

    constraints = {
        t.name: ParameterConstraints(sharding_types=[t.sharding])
        for t in cfg.model.specs()
        if t.sharding is not None
    }
    return DMPCollection(
        module,
        cfg.group_size(world),
        device=device,
        constraints=constraints or None,
        replica_layout=cfg.parallel.replica_layout,
        node_group_size=cfg.parallel.node_group_size,
        planner_batch_size=cfg.data.batch_size_per_rank,
        sync_options=cfg.parallel.sync.options(),
    )


def _report(rank: int, error: BaseException, with_traceback: bool) -> None:
    text = str(error).replace("\n", " ")
    if with_traceback:
        traceback.print_exc()
    print(
        f"sparse2d.train: rank {rank}: {type(error).__name__}: {text}", file=sys.stderr, flush=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.train", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file (configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a native abort (SIGABRT/SIGSEGV) prints every thread's stack
    _single_process_env()
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    world, local_world = _env_int("WORLD_SIZE", 1), _env_int("LOCAL_WORLD_SIZE", 1)
    code = 1
    try:
        # Deterministic checks on every rank, before any collective: all ranks agree.
        cfg = load_config(args.config, args.overrides)
        cfg.check_runtime(world, local_world)
        device = resolve_device(cfg)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.set_num_threads(max(1, _env_int("OMP_NUM_THREADS", torch.get_num_threads())))
        warnings.filterwarnings("ignore")
        for name in ("torchrec", "torch.fx", "fbgemm_gpu"):  # planner/tracing chatter
            logging.getLogger(name).setLevel(logging.ERROR)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=cfg.parallel.timeout_s),
        )
        from sparse2d.trainer_loop import Loop

        Loop(cfg, device).run()
        code = 0
    except ConfigError as error:
        if local_rank == 0:  # the same on every rank: once per host
            _report(rank, error, with_traceback=False)
    except Exception as error:
        _report(rank, error, with_traceback=True)
    finally:
        if dist.is_initialized():
            if code == 0:
                dist.barrier()  # every rank finished its collectives and file writes
            # Skip native teardown: on failure, do not wait in destroy for ranks still
            # working; on success nothing is left to do, and process-group/thread-pool
            # destructors at exit were seen (rarely, under load) to abort with
            # "terminate called without an active exception" after a clean run.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
