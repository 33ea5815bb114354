#!/usr/bin/env bash
# Fault-tolerant 2D on one host (torchft): a lighthouse plus NGROUPS torchruns of NPROC
# processes; each torchrun is ONE sharding group (a torchft replica group) and restarts only
# its own group. Extra arguments are dotted config overrides, e.g.
#   NGROUPS=2 NPROC=2 launch/ft_local.sh train.steps=300
#   NGROUPS  replica groups (default 2)         NPROC  processes per group (default 2)
#   CONFIG   YAML (default configs/ft_tiny_cpu.yaml)  PYTHON  interpreter (default .venv/bin/python)
#   MAX_RESTARTS  restarts of one group after one of its workers fails (default 3)
#   MIN_REPLICAS  fewest groups a step commits with (default 1)
#   LIGHTHOUSE_PORT  (default 0: a free port the lighthouse binds itself, so jobs side by side
#                    never share one; a fixed port already taken stops the launch in one line)
#   SPARSE2D_FT_JOB  the job's name (default: ft-<time>-<pid>); the lighthouse carries it and
#                    a group refuses a lighthouse of another job (sparse2d/ft/lighthouse.py).
#   A lighthouse already running: export TORCHFT_LIGHTHOUSE (and SPARSE2D_FT_JOB if it has one).
# Worker output: stdout here; torchft's (verbose) stderr in RUN_DIR/replica_<g>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
NGROUPS="${NGROUPS:-2}"
NPROC="${NPROC:-2}"
CONFIG="${CONFIG:-configs/ft_tiny_cpu.yaml}"
source launch/python.sh  # PYTHON: the set value, else .venv/bin/python, else python3
MAX_RESTARTS="${MAX_RESTARTS:-3}"
MIN_REPLICAS="${MIN_REPLICAS:-1}"
LIGHTHOUSE_PORT="${LIGHTHOUSE_PORT:-0}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0  # a store per restart round (see local.sh)
for var in NGROUPS NPROC MAX_RESTARTS MIN_REPLICAS LIGHTHOUSE_PORT; do
  [[ "${!var}" =~ ^[0-9]+$ ]] || { echo "sparse2d: ft launch: $var=${!var} must be a whole number" >&2; exit 1; }
done
[[ "$NGROUPS" -ge 1 && "$NPROC" -ge 1 ]] || { echo "sparse2d: ft launch: NGROUPS and NPROC must be >= 1" >&2; exit 1; }
FT=(fault_tolerance.enable=true "fault_tolerance.num_groups=$NGROUPS" "fault_tolerance.min_replica_size=$MIN_REPLICAS")
# Validate once before starting anything (a bad key is one line here, not one per rank).
"$PYTHON" -m sparse2d.train.config --check "$CONFIG" --world-size "$NPROC" --local-world-size "$NPROC" "$@" "${FT[@]}"
RUN_DIR=$("$PYTHON" -c 'import sys; from sparse2d.train.config import load_config; print(load_config(sys.argv[1], sys.argv[2:]).run_dir)' "$CONFIG" "$@" "${FT[@]}")
mkdir -p "$RUN_DIR"
# A restarted group that finds no live group checks whether another group finished THIS job.
export SPARSE2D_FT_LAUNCH_TIME="$(date +%s)"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM
if [[ -z "${TORCHFT_LIGHTHOUSE:-}" ]]; then
  export SPARSE2D_FT_JOB="${SPARSE2D_FT_JOB:-ft-$(date +%s)-$$}"
  rm -f "$RUN_DIR/lighthouse.port"
  # On loopback: every group of this launch is on this host, and torchft's lighthouse answers
  # anyone who reaches it (docs/fault_tolerance.md, "Strangers at the ports").
  "$PYTHON" -m sparse2d.ft.lighthouse --host 127.0.0.1 --port "$LIGHTHOUSE_PORT" --min-replicas "$MIN_REPLICAS" \
    --job-id "$SPARSE2D_FT_JOB" --port-file "$RUN_DIR/lighthouse.port" >"$RUN_DIR/lighthouse.log" 2>&1 &
  PIDS+=($!)
  for ((i = 0; i < 600; i++)); do  # the port it serves, once it listens (up to 60 s)
    [[ -s "$RUN_DIR/lighthouse.port" ]] || ! kill -0 "${PIDS[-1]}" 2>/dev/null && break
    sleep 0.1
  done
  [[ -s "$RUN_DIR/lighthouse.port" ]] || { echo "sparse2d: ft launch: the lighthouse did not start (LIGHTHOUSE_PORT=$LIGHTHOUSE_PORT): $(tail -1 "$RUN_DIR/lighthouse.log")" >&2; exit 1; }
  export TORCHFT_LIGHTHOUSE="http://127.0.0.1:$(<"$RUN_DIR/lighthouse.port")"
else  # someone else's lighthouse: it must serve this job (one line here, not one per rank)
  "$PYTHON" -m sparse2d.ft.lighthouse --check "$TORCHFT_LIGHTHOUSE" || exit 1
fi
GROUP_PIDS=()
for ((g = 0; g < NGROUPS; g++)); do
  "$PYTHON" -m sparse2d.train.torchrun --standalone --nproc-per-node "$NPROC" \
    --max-restarts "$MAX_RESTARTS" \
    -m sparse2d.train --config "$CONFIG" "$@" "${FT[@]}" "fault_tolerance.replica_id=$g" \
    2>"$RUN_DIR/replica_$g.log" &
  PIDS+=($!)
  GROUP_PIDS+=($!)
done
code=0
for pid in "${GROUP_PIDS[@]}"; do
  wait "$pid" || code=$?
done
exit "$code"
