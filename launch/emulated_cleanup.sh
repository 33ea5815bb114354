#!/usr/bin/env bash
# Remove everything of the emulated cluster named ID (launch/emulated_hosts.sh's CLUSTER_ID,
# cluster.json's "id"): its processes, network namespaces, bridge, links and /etc/netns files.
#   launch/emulated_cleanup.sh ID
# Works from the machine's state alone, so it also removes what a SIGKILLed launcher left
# (its own trap never ran): the processes are found by the SPARSE2D_EMULATED_CLUSTER=ID that
# the launcher puts in the environment of everything it starts (the lighthouse outside every
# host too) and by their namespace; the rest by its names. The launcher runs it on exit and
# before it starts a cluster of a given name; a test or bench runs it in its teardown.
# Processes get SIGTERM and 5 s to exit, then SIGKILL; a launcher of that name is SIGKILLed at
# once (its trap would tear down again, racing this). The caller (this script's parent) is
# spared: the launcher calls it from its own trap. Prints one line to stderr when it removed
# anything; exit 0, 1 naming what it could not remove, 2 on a bad ID or without root.
set -uo pipefail
MARK=SPARSE2D_EMULATED_CLUSTER
if [[ -n "${!MARK:-}" ]]; then  # this script and its children must not carry the mark
  exec env -u "$MARK" "$BASH" "$0" "$@"
fi
refuse() { echo "sparse2d: emulated cleanup: $*" >&2; exit 2; }
(( $# == 1 )) || refuse "usage: launch/emulated_cleanup.sh ID (the cluster's name, cluster.json's \"id\")"
ID=$1
[[ "$ID" =~ ^[0-9a-z]{1,8}$ ]] || refuse "ID=$ID: a cluster's name is 1 to 8 of 0-9 a-z"
[[ "$EUID" == 0 ]] || refuse "needs root (network namespaces)"

namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^sparse2d-$ID-h[0-9]+\$"; }
links() {
  ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' \
    | grep -E "^(s2v${ID}h[0-9]+|s2b$ID)\$"
}
processes() {  # marked with this cluster's name, or inside one of its namespaces
  {
    grep -lzx "$MARK=$ID" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
    local ns
    for ns in $(namespaces); do ip netns pids "$ns" 2>/dev/null; done
  } | sort -un | grep -vx -e "$$" -e "$PPID"
}
launcher() {  # is pid $1 a launch/emulated_hosts.sh?
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q 'emulated_hosts\.sh'
}

found=$(processes | wc -l)
for pid in $(processes); do launcher "$pid" && kill -KILL "$pid" 2>/dev/null; done
processes | xargs -r kill -TERM 2>/dev/null
for ((round = 0; round < 50; round++)); do  # up to 5 s for a clean exit
  [[ -z "$(processes)" ]] && break
  sleep 0.1
done
processes | xargs -r kill -KILL 2>/dev/null
for ((round = 0; round < 50; round++)); do  # a killed process holds its namespace till reaped
  [[ -z "$(processes)" ]] && break
  sleep 0.1
done
left_ns=$(namespaces)
left_links=$(links)
for link in $left_links; do ip link del "$link" 2>/dev/null; done  # a veth takes its peer
for ns in $left_ns; do ip netns del "$ns" 2>/dev/null; done
rm -rf /etc/netns/sparse2d-"$ID"-h*
if (( found > 0 )) || [[ -n "$left_ns$left_links" ]]; then
  echo "sparse2d: emulated cleanup: cluster $ID: removed $found process(es)," \
    "$(wc -w <<<"$left_ns") namespace(s), $(wc -w <<<"$left_links") link(s)" >&2
fi
still=$( (processes; namespaces; links) | tr '\n' ' ')
[[ -z "$still" ]] || { echo "sparse2d: emulated cleanup: cluster $ID: still there: $still" >&2; exit 1; }
exit 0
