#!/usr/bin/env bash
# Single host: NPROC processes via `torchrun --standalone`. Extra arguments are dotted
# config overrides, e.g.  launch/local.sh train.steps=100 parallel.sharding_group_size=4
#   NPROC   processes (default 4)          CONFIG  YAML file (default configs/tiny_cpu.yaml)
#   PYTHON  interpreter (default .venv/bin/python)  OMP_NUM_THREADS  threads per process (default 1)
#   MAX_RESTARTS  restarts of the whole worker group after a worker fails (default 3); the
#           restarted job resumes from the latest complete checkpoint (train.resume=auto)
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC="${NPROC:-4}"
CONFIG="${CONFIG:-configs/tiny_cpu.yaml}"
source launch/python.sh  # PYTHON: the set value, else .venv/bin/python, else python3
MAX_RESTARTS="${MAX_RESTARTS:-3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Restart rounds: torchrun's agent store stays shared (its default, bound once by the agent);
# the trainer's rank 0 hosts a fresh store per round on a port it binds itself and hands it out
# through the agent store under that round's key (sparse2d/train/rendezvous.py): no stale
# addresses from killed workers, and no port that another process can take before rank 0 binds.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0  # even if the caller's environment set it
for var in NPROC MAX_RESTARTS; do  # numbers only: torchrun's own message would be a traceback
  [[ "${!var}" =~ ^[0-9]+$ ]] || { echo "sparse2d: launch: $var=${!var} must be a whole number (e.g. $var=4)" >&2; exit 1; }
done
[[ "$NPROC" -ge 1 ]] || { echo "sparse2d: launch: NPROC=$NPROC must be >= 1 (processes on this host)" >&2; exit 1; }
# Validate the config (and the world size) once, before starting any process: a bad key
# or value is one line here instead of an error from every rank.
"$PYTHON" -m sparse2d.train.config --check "$CONFIG" --world-size "$NPROC" --local-world-size "$NPROC" "$@"
# torchrun, whose workers end the job on a ConfigError instead of being restarted into it
exec "$PYTHON" -m sparse2d.train.torchrun --standalone --nproc-per-node "$NPROC" \
  --max-restarts "$MAX_RESTARTS" \
  -m sparse2d.train --config "$CONFIG" "$@"
