#!/usr/bin/env bash
# Several hosts: run this on every host with the same rendezvous endpoint.
#   NNODES       hosts in the job                 NODE_RANK  this host's index (0..NNODES-1)
#   NPROC        processes (GPUs) per host        MASTER_ADDR, MASTER_PORT  rendezvous endpoint
#   CONFIG       YAML file                        PYTHON     interpreter (default .venv/bin/python)
#   RDZV_ID      job id shared by all hosts (default sparse2d)
#   LOCAL_ADDR   this host's address on the job's network (optional; where a host has several
#                interfaces, or its hostname does not resolve to that network): torchrun's agent
#                advertises it, and the host whose LOCAL_ADDR is MASTER_ADDR hosts the rendezvous
#   ENTRY        the Python module each worker runs instead of the trainer (your own training
#                script as a module, e.g. my_pkg.train); extra arguments then go to it as they
#                are (no config check)
#   MAX_RESTARTS restarts of the worker group after a failure (default 3; resumes from the
#                latest complete checkpoint with train.resume=auto)
# Extra arguments are dotted config overrides. Example (host 3 of 16):
#   NNODES=16 NODE_RANK=3 NPROC=8 MASTER_ADDR=node0 MASTER_PORT=29500 \
#     CONFIG=configs/dlrm_criteo_1host_8gpu.yaml launch/multinode.sh parallel.sharding_group_size=32
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
NPROC="${NPROC:-8}"
MASTER_PORT="${MASTER_PORT:-29500}"
ENTRY="${ENTRY:-}"
[[ -n "$ENTRY" ]] || CONFIG="${CONFIG:?set CONFIG}"
source launch/python.sh  # PYTHON: the set value, else .venv/bin/python, else python3
MAX_RESTARTS="${MAX_RESTARTS:-3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# A fresh rendezvous store per restart round (see launch/local.sh): without it, restarted
# workers read the dead workers' addresses from the agent's reused store and cannot connect.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
for var in NNODES NODE_RANK NPROC MAX_RESTARTS MASTER_PORT; do
  [[ "${!var}" =~ ^[0-9]+$ ]] || { echo "sparse2d: launch: $var=${!var} must be a whole number" >&2; exit 1; }
done
if (( NNODES < 1 || NPROC < 1 || NODE_RANK >= NNODES )); then
  echo "sparse2d: launch: need NNODES >= 1, NPROC >= 1 and NODE_RANK < NNODES (got NNODES=$NNODES NPROC=$NPROC NODE_RANK=$NODE_RANK); NODE_RANK counts hosts from 0" >&2
  exit 1
fi
if [[ -n "$ENTRY" ]]; then
  MODULE=(-m "$ENTRY")
else
  # World-size checks only (data paths may exist only on the compute hosts' file systems).
  "$PYTHON" -m sparse2d.train.config --check "$CONFIG" --world-size $((NNODES * NPROC)) \
    --local-world-size "$NPROC" --no-paths "$@"
  MODULE=(-m sparse2d.train --config "$CONFIG")
fi
LOCAL=()
if [[ -n "${LOCAL_ADDR:-}" ]]; then
  # torchrun decides who hosts the c10d store by matching MASTER_ADDR against the machine's
  # hostname and addresses, which fails inside a network namespace or on a second interface.
  LOCAL=(--local-addr "$LOCAL_ADDR" --rdzv-conf "is_host=$([[ "$LOCAL_ADDR" == "$MASTER_ADDR" ]] && echo true || echo false)")
fi
# torchrun, whose workers end the job on a ConfigError (sparse2d/train/torchrun.py)
exec "$PYTHON" -m sparse2d.train.torchrun "${LOCAL[@]}" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
  --nproc-per-node "$NPROC" --max-restarts "$MAX_RESTARTS" \
  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id "${RDZV_ID:-sparse2d}" "${MODULE[@]}" "$@"
