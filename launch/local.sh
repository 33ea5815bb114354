#!/usr/bin/env bash
# Single host: NPROC processes via `torchrun --standalone`. Extra arguments are dotted
# config overrides, e.g.  launch/local.sh train.steps=100 parallel.sharding_group_size=4
#   NPROC   processes (default 4)          CONFIG  YAML file (default configs/tiny_cpu.yaml)
#   PYTHON  interpreter (default python3)  OMP_NUM_THREADS  threads per process (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC="${NPROC:-4}"
CONFIG="${CONFIG:-configs/tiny_cpu.yaml}"
PYTHON="${PYTHON:-python3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Validate the config (and the world size) once, before starting any process: a bad key
# or value is one line here instead of an error from every rank.
"$PYTHON" -m sparse2d.train.config --check "$CONFIG" --world-size "$NPROC" --local-world-size "$NPROC" "$@"
exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
  -m sparse2d.train --config "$CONFIG" "$@"
