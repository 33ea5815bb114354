#!/usr/bin/env bash
# An emulated cluster on this one machine: HOSTS network namespaces ("hosts") on one bridge,
# each host's link shaped both ways to LINK with `tc tbf`, and in each host the same launch a
# real host would run (launch/multinode.sh; with FT=1 one fault-tolerant sharding group per
# host, as launch/ft_slurm.sbatch runs it, and the lighthouse outside every host). Needs root
# and iproute2 (ip, tc). Extra arguments are dotted config overrides, e.g.
#   HOSTS=2 NPROC=4 LINK=200mbit launch/emulated_hosts.sh parallel.sharding_group_size=4
#   HOSTS        hosts (default 2)                NPROC  ranks per host (default 4)
#   LINK         each host's link rate, tc syntax (default 200mbit; e.g. 100mbit, 1gbit;
#                `none`: not shaped)
#   CONFIG       YAML (default configs/cluster_cpu.yaml)   PYTHON  interpreter (default the
#                project's .venv/bin/python, else python3: launch/python.sh)
#   FT           0 (default): one torchrun world over every host; 1: fault tolerant, one
#                sharding group (a torchft replica group) per host
#   HOST_RESTARTS  times a host whose launcher died is started again, as a cluster scheduler
#                restarts a lost node (default 3)
#   MAX_RESTARTS torchrun's restarts inside one host's launch (default 3)
#   ENTRY        a Python module every rank runs instead of the trainer (e.g. your own script
#                as a module); extra arguments go to it as they are; RUN_DIR (default
#                runs/emulated) then holds cluster.json and the hosts' logs (FT=0 only)
#   CLUSTER_ID   this cluster's name, 1-8 of 0-9 a-z (default: a random unused one); what a
#                killed launcher of that name left behind is removed before it starts
# What is emulated: hosts (own network stack, own hostname, own interface), link bandwidth
# both ways. What is not: latency (no netem here), CPUs (every host shares this machine's).
# RUN_DIR/cluster.json names each host's namespace, address, interfaces, launcher pid and
# link; RUN_DIR/host_<i>.log holds each host's output (host 0's is also printed here).
# Everything made (namespaces, bridge, links, processes) is removed on exit, error or signal,
# by launch/emulated_cleanup.sh; when this script is SIGKILLed (its trap cannot run), running
# that script with the cluster's name removes it, and so does the next start of that name.
set -euo pipefail
refuse() { echo "sparse2d: emulated hosts: $*" >&2; exit 2; }
# Names unique to this run: two runs side by side never share a namespace, link or subnet.
# Every process started here carries SPARSE2D_EMULATED_CLUSTER=<name> in its environment
# (this script too, by the exec below): the cleanup finds them by it, with no state kept.
if [[ -n "${CLUSTER_ID:-}" ]]; then
  [[ "$CLUSTER_ID" =~ ^[0-9a-z]{1,8}$ ]] || refuse "CLUSTER_ID=$CLUSTER_ID: a cluster's name is 1 to 8 of 0-9 a-z"
  ID=$CLUSTER_ID
else
  for ((try = 0; try < 16; try++)); do
    ID=$(printf '%05x' $(( (RANDOM << 15 | RANDOM) % 1048576 )))
    ! ip netns list 2>/dev/null | grep -q "^sparse2d-$ID-" && break
  done
fi
if [[ "${SPARSE2D_EMULATED_CLUSTER:-}" != "$ID" ]]; then
  export SPARSE2D_EMULATED_CLUSTER="$ID" CLUSTER_ID="$ID"
  exec "$BASH" "$0" "$@"
fi
cd "$(dirname "$0")/.."
HOSTS="${HOSTS:-2}"
NPROC="${NPROC:-4}"
LINK="${LINK:-200mbit}"
CONFIG="${CONFIG:-configs/cluster_cpu.yaml}"
FT="${FT:-0}"
HOST_RESTARTS="${HOST_RESTARTS:-3}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"
for var in HOSTS NPROC HOST_RESTARTS MAX_RESTARTS; do
  [[ "${!var}" =~ ^[0-9]+$ ]] || refuse "$var=${!var} must be a whole number"
done
(( HOSTS >= 1 && HOSTS <= 200 && NPROC >= 1 )) || refuse "need 1 <= HOSTS <= 200 and NPROC >= 1 (got HOSTS=$HOSTS NPROC=$NPROC)"
[[ "$FT" == 0 || "$FT" == 1 ]] || refuse "FT=$FT must be 0 or 1"
[[ "$LINK" == none || "$LINK" =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] \
  || refuse "LINK=$LINK is not a rate; use a number with bit, kbit, mbit or gbit (e.g. LINK=200mbit) or LINK=none"
[[ "$EUID" == 0 ]] || refuse "needs root (network namespaces and tc); run it as root, or use launch/local.sh for one host"
for tool in ip tc unshare; do
  command -v "$tool" >/dev/null || refuse "'$tool' not found; install iproute2 and util-linux (apt-get install iproute2 util-linux)"
done
source launch/python.sh  # PYTHON: the set value, else .venv/bin/python, else python3

FT_ARGS=()
(( FT == 1 )) && FT_ARGS=(fault_tolerance.enable=true "fault_tolerance.num_groups=$HOSTS")
ENTRY="${ENTRY:-}"
if [[ -n "$ENTRY" ]]; then
  (( FT == 0 )) || refuse "ENTRY=$ENTRY runs with FT=0 only (the fault-tolerant launch is the trainer's)"
  RUN_DIR="${RUN_DIR:-runs/emulated}"
else
  # Validate once before anything starts (a bad key is one line here, not one per rank).
  "$PYTHON" -m sparse2d.train.config --check "$CONFIG" --world-size "$(( FT == 1 ? NPROC : HOSTS * NPROC ))" \
    --local-world-size "$NPROC" "$@" "${FT_ARGS[@]}" || exit 2
  RUN_DIR=$("$PYTHON" -c 'import sys; from sparse2d.train.config import load_config; print(load_config(sys.argv[1], sys.argv[2:]).run_dir)' "$CONFIG" "$@" "${FT_ARGS[@]}")
fi
# A cluster of this name left by a launcher that was SIGKILLed: removed before anything starts.
launch/emulated_cleanup.sh "$ID" || exit 1
BRIDGE="s2b$ID"
NAMESPACES=()
LAUNCHERS=()
cleanup() {
  trap - EXIT INT TERM
  # The log follower first: it holds this script's stdout open until this process is reaped,
  # so a caller reading that output to its end would wait for ever.
  [[ -n "${TAIL_PID:-}" ]] && kill "$TAIL_PID" 2>/dev/null || true
  launch/emulated_cleanup.sh "$ID" 2>/dev/null || true  # spares its caller: this script
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A /24 no interface of this machine uses yet.
for ((try = 0; try < 64; try++)); do
  SUBNET="10.$(( 200 + RANDOM % 54 )).$(( RANDOM % 256 ))"
  ip -o -4 addr show | grep -q " $SUBNET\." || ip -4 route show | grep -q "^$SUBNET\." || break
done
BRIDGE_ADDR="$SUBNET.1"
ip link add "$BRIDGE" type bridge 2>/dev/null \
  || refuse "cannot create a bridge (ip link add type bridge failed: no bridge support in this kernel or container)"
ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
LINK_BITS=$("$PYTHON" -m sparse2d.train.emulated_topology bits "$LINK") || exit 2
shape() {  # shape <netns or ""> <interface>: up, and tbf at LINK on its egress (LINK=none: up only)
  ip ${1:+-n "$1"} link set "$2" up
  [[ "$LINK" == none ]] && return 0
  local burst=$(( LINK_BITS / 8 / 100 ))  # 10 ms at the rate, at least 64 KiB (a GSO segment)
  (( burst < 65536 )) && burst=65536
  tc ${1:+-n "$1"} qdisc replace dev "$2" root tbf rate "$LINK" burst "$burst" latency 50ms \
    || refuse "tc could not shape $2 to $LINK (no tbf qdisc support?)"
}
for ((h = 0; h < HOSTS; h++)); do
  ns="sparse2d-$ID-h$h"
  ip netns add "$ns" 2>/dev/null || refuse "cannot create network namespace $ns (ip netns add failed)"
  NAMESPACES+=("$ns")
  ip link add "s2v${ID}h$h" type veth peer name "s2v${ID}p$h" netns "$ns" \
    || refuse "cannot create a veth pair (no veth support?)"
  ip -n "$ns" link set "s2v${ID}p$h" name eth0
  ip -n "$ns" addr add "$SUBNET.$(( h + 2 ))/24" dev eth0
  ip -n "$ns" link set lo up
  ip link set "s2v${ID}h$h" master "$BRIDGE"
  shape "" "s2v${ID}h$h"  # into the host
  shape "$ns" eth0        # out of the host
done
# Each host resolves every host's name (its hostname is its namespace's name): `ip netns exec`
# mounts /etc/netns/NAMESPACE/hosts over /etc/hosts inside that namespace only.
for ns in "${NAMESPACES[@]}"; do
  mkdir -p "/etc/netns/$ns"
  { echo "127.0.0.1 localhost"
    for ((h = 0; h < HOSTS; h++)); do echo "$SUBNET.$(( h + 2 )) sparse2d-$ID-h$h"; done
    echo "$BRIDGE_ADDR sparse2d-$ID-bridge"; } >"/etc/netns/$ns/hosts"
done

mkdir -p "$RUN_DIR"
MASTER_ADDR="$SUBNET.2"
MASTER_PORT=29500
if (( FT == 1 )); then
  # The lighthouse runs outside every host (as a cluster service would), on the bridge.
  # One name for the job on every host and relaunch: the lighthouse refuses another job's
  # groups, and a host's relaunch may write into its group's records again.
  export SPARSE2D_FT_JOB="emulated-$ID"
  # Bound to the bridge's address only: the hosts reach it there, nothing else needs to.
  "$PYTHON" -m sparse2d.ft.lighthouse --host "$BRIDGE_ADDR" --port 0 --min-replicas "${MIN_REPLICAS:-1}" \
    --job-id "$SPARSE2D_FT_JOB" --port-file "$RUN_DIR/lighthouse.port" >"$RUN_DIR/lighthouse.log" 2>&1 &
  LIGHTHOUSE_PID=$!
  for ((i = 0; i < 600; i++)); do
    [[ -s "$RUN_DIR/lighthouse.port" ]] || ! kill -0 "$LIGHTHOUSE_PID" 2>/dev/null && break
    sleep 0.1
  done
  [[ -s "$RUN_DIR/lighthouse.port" ]] || { echo "sparse2d: emulated hosts: the lighthouse did not start: $(tail -3 "$RUN_DIR/lighthouse.log")" >&2; exit 1; }
  export TORCHFT_LIGHTHOUSE="http://$BRIDGE_ADDR:$(<"$RUN_DIR/lighthouse.port")"
  export SPARSE2D_FT_LAUNCH_TIME="$(date +%s)"
fi

start_host() {  # start_host <h>: the host's launch in its namespace, under its own hostname
  local h=$1 ns="sparse2d-$ID-h$1" addr="$SUBNET.$(( $1 + 2 ))" cmd
  shift
  if (( FT == 1 )); then
    # One sharding group per host: its own torchrun world (launch/ft_local.sh's per group).
    cmd=(env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
      "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC"
      --max-restarts "$MAX_RESTARTS" -m sparse2d.train --config "$CONFIG" "$@" "${FT_ARGS[@]}"
      "fault_tolerance.replica_id=$h")
  else
    cmd=(env NNODES="$HOSTS" NODE_RANK="$h" NPROC="$NPROC" MASTER_ADDR="$MASTER_ADDR"
      MASTER_PORT="$MASTER_PORT" LOCAL_ADDR="$addr" RDZV_ID="sparse2d-$ID" CONFIG="$CONFIG"
      PYTHON="$PYTHON" MAX_RESTARTS="$MAX_RESTARTS" ENTRY="$ENTRY" launch/multinode.sh "$@")
  fi
  # setsid: the launch and its workers form one process group, killed together on teardown.
  ip netns exec "$ns" unshare --uts setsid bash -c 'hostname "$0" && exec "$@"' "$ns" \
    env GLOO_SOCKET_IFNAME=eth0 "${cmd[@]}" >>"$RUN_DIR/host_$h.log" 2>&1 &
  LAUNCHERS[$h]=$!
}
# What the advisor prices under this launch (sharding_group_size / replica_layout: auto,
# `sparse2d plan --topology RUN_DIR/topology.yaml`): the CPU preset with this cluster's hosts,
# cores and links (sparse2d/train/emulated_topology.py says why each host gets twice its
# even share of the cores; the cluster bench prices stored runs with the same writer).
"$PYTHON" -m sparse2d.train.emulated_topology yaml "$HOSTS" "$NPROC" "$LINK" "$ID" >"$RUN_DIR/topology.yaml"
export SPARSE2D_TOPOLOGY="$PWD/$RUN_DIR/topology.yaml"
[[ "$RUN_DIR" == /* ]] && export SPARSE2D_TOPOLOGY="$RUN_DIR/topology.yaml"
write_cluster_json() {
  local h entries=()
  for ((h = 0; h < HOSTS; h++)); do
    entries+=("{\"host\": $h, \"namespace\": \"sparse2d-$ID-h$h\", \"address\": \"$SUBNET.$(( h + 2 ))\", \"interface\": \"eth0\", \"bridge_interface\": \"s2v${ID}h$h\", \"launcher_pid\": ${LAUNCHERS[$h]:-null}, \"link\": \"$LINK\", \"ranks\": $NPROC}")
  done
  local IFS=,
  printf '{"id": "%s", "bridge": "%s", "bridge_address": "%s", "fault_tolerant": %s, "hosts": [%s]}\n' \
    "$ID" "$BRIDGE" "$BRIDGE_ADDR" "$( (( FT == 1 )) && echo true || echo false)" "${entries[*]}" \
    >"$RUN_DIR/cluster.json.tmp"
  mv "$RUN_DIR/cluster.json.tmp" "$RUN_DIR/cluster.json"
}
: >"$RUN_DIR/host_0.log"
for ((h = 0; h < HOSTS; h++)); do : >"$RUN_DIR/host_$h.log"; start_host "$h" "$@"; done
write_cluster_json
tail -n +1 -f "$RUN_DIR/host_0.log" --pid=$$ 2>/dev/null &
TAIL_PID=$!
echo "sparse2d: emulated hosts: $HOSTS hosts x $NPROC ranks, links $LINK, run $ID; logs $RUN_DIR/host_<i>.log" >&2

# Play the scheduler: a host whose launch fails is started again, up to HOST_RESTARTS times.
declare -a STATE RESTARTS
for ((h = 0; h < HOSTS; h++)); do STATE[$h]=running; RESTARTS[$h]=0; done
code=0
done_at=""
while :; do
  running=0
  for ((h = 0; h < HOSTS; h++)); do
    [[ "${STATE[$h]}" == running ]] || continue
    if kill -0 "${LAUNCHERS[$h]}" 2>/dev/null; then running=$(( running + 1 )); continue; fi
    rc=0; wait "${LAUNCHERS[$h]}" || rc=$?
    if (( rc == 0 )); then
      STATE[$h]=done; done_at="${done_at:-$SECONDS}"
    elif [[ -z "$done_at" ]] && (( RESTARTS[h] < HOST_RESTARTS )); then
      RESTARTS[$h]=$(( RESTARTS[h] + 1 ))
      echo "sparse2d: emulated hosts: host $h's launch exited $rc; starting it again (${RESTARTS[$h]} of $HOST_RESTARTS)" >&2
      start_host "$h" "$@"; write_cluster_json; running=$(( running + 1 ))
    else
      STATE[$h]=failed; code=$rc
      echo "sparse2d: emulated hosts: host $h's launch exited $rc (see $RUN_DIR/host_$h.log)" >&2
    fi
  done
  (( running == 0 )) && break
  # Once a host finished the job, the others get 120 s to finish too (a host restarted after
  # the job ended would wait for a rendezvous that never comes).
  if [[ -n "$done_at" ]] && (( SECONDS - done_at > 120 )); then
    echo "sparse2d: emulated hosts: $running host(s) still running 120 s after the job finished; stopping them" >&2
    code=1; break
  fi
  sleep 0.5
done
exit "$code"
