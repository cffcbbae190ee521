#!/usr/bin/env bash
# Bring up the holopeer container testnet: a private "internet" with two
# bootstrap/relay nodes, three home routers doing NAT (router-a and router-c
# cone, hole-punchable; router-b symmetric), stage nodes on the internet and
# behind the routers, and a researcher's machine behind router-a. Images are
# built here (no registry); a previous testnet is torn down first.
#
#   testnet/up.sh [--nodes N] [--wan RATE:DELAY] [--no-build]
#
#   --nodes N      stage nodes besides the bootstraps and the researcher
#                  (default 5: stage-a-1, stage-b-1, stage-c-1, pub-1, pub-2;
#                  more are dealt out in that order). Five is the least with
#                  which a NATed node sees four public peers, the number
#                  go-libp2p wants before it trusts an observed address.
#   --wan R:D      shape every router's internet link, e.g. 80mbit:40ms:
#                  RATE caps each direction, DELAY is added to each round
#                  trip through the router (tc netem; where the kernel has no
#                  netem, only the rate is applied, and up.sh says so)
#   --no-build     reuse testnet/.cache/build/holopeer instead of go build
#
# Environment: HOLOPEER_BIN=/path (use this static binary), TN_KEEP_ON_FAILURE=1
# (leave a failed start up for inspection), TN_EXTRA_FLAGS="..." (added to
# every node's `holopeer up`).
set -euo pipefail
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/docker/lib.sh"

nodes=5
wan=""
while [ $# -gt 0 ]; do
	case $1 in
	--nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
	--nodes=*) nodes=${1#*=}; shift ;;
	--wan) wan=${2:?--wan needs RATE:DELAY}; shift 2 ;;
	--wan=*) wan=${1#*=}; shift ;;
	--no-build) export TN_NO_BUILD=1; shift ;;
	-h | --help) tn_usage "$0"; exit 0 ;;
	*) tn_die "unknown argument $1 (see testnet/up.sh --help)" ;;
	esac
done
[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 60 ] || tn_die "--nodes $nodes: use 1 to 60"
if [ -n "$wan" ]; then
	[[ $wan =~ ^([0-9]+(kbit|mbit|gbit))?(:[0-9]+ms)?$ ]] && [ "$wan" != : ] ||
		tn_die "--wan $wan: use RATE:DELAY such as 80mbit:40ms (either part may be left out: 80mbit or :40ms)"
fi

tn_docker_ok || tn_die "no Docker engine answers (docker info failed)"
started=$SECONDS

# Any failure or interrupt from here on leaves nothing behind.
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ $rc -ne 0 ]; then
		if [ "${TN_KEEP_ON_FAILURE:-0}" = 1 ]; then
			tn_log "start failed; TN_KEEP_ON_FAILURE=1 leaves it up (testnet/down.sh removes it)"
		else
			tn_log "start failed; tearing down"
			"$TN_ROOT/testnet/down.sh" >/dev/null 2>&1 || true
		fi
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$TN_ROOT/testnet/down.sh" >/dev/null 2>&1 || tn_log "warning: tearing down a previous testnet left something behind"
mkdir -p "$TN_RUN"
tn_build_images
tn_detect_features
: >"$TN_RUN/peers"
tn_env_set TN_SWARM "$TN_SWARM"
tn_env_set TN_WAN "$wan"
tn_flags_for_features ""

# Deal the stage nodes out over the sites.
declare -A scale=([pub]=0 [stage-a]=0 [stage-b]=0 [stage-c]=0)
order=(stage-a stage-b stage-c pub pub)
for ((i = 0; i < nodes; i++)); do
	svc=${order[i % ${#order[@]}]}
	scale[$svc]=$((scale[$svc] + 1))
done
scale_args=()
for svc in pub stage-a stage-b stage-c; do scale_args+=(--scale "$svc=${scale[$svc]}"); done

# boot-1 first; its address goes to boot-2; both to everyone else.
addr_of() { # NAME IP -> the node's dialable multiaddrs
	local id
	id=$(tn_peer_id "$1") || tn_die "cannot read $1's peer id"
	echo "/ip4/$2/tcp/7600/p2p/$id,/ip4/$2/udp/7600/quic-v1/p2p/$id"
}
tn_log "starting boot-1"
tn_compose up -d boot-1 >/dev/null 2>"$TN_RUN/compose.log" || { cat "$TN_RUN/compose.log" >&2; tn_die "compose up boot-1 failed"; }
tn_wait_healthy boot-1 180
boot1=$(addr_of boot-1 7.7.7.2)
tn_env_set TN_BOOT2_JOIN "--bootstrap $boot1"
tn_log "starting boot-2"
tn_compose up -d boot-2 >/dev/null 2>"$TN_RUN/compose.log" || { cat "$TN_RUN/compose.log" >&2; tn_die "compose up boot-2 failed"; }
tn_wait_healthy boot-2 180
boot2=$(addr_of boot-2 7.7.7.3)
tn_env_set TN_JOIN "--bootstrap $boot1,$boot2"
tn_flags_for_features "$boot1,$boot2"

tn_log "starting routers and nodes (${scale_args[*]})"
tn_compose up -d "${scale_args[@]}" >/dev/null 2>"$TN_RUN/compose.log" || { cat "$TN_RUN/compose.log" >&2; tn_die "compose up failed"; }

# Every node answers on its API, then boot-1 sees every one of them.
expected=$(tn_containers all | awk '$4 != "router" { print $1 }')
deadline=$((SECONDS + 180))
for n in $expected; do
	until tn_peer_id "$n" >/dev/null 2>&1; do
		id=$(tn_cid "$n")
		if [ "$(docker inspect --format '{{.RestartCount}}' "$id")" -ge 4 ]; then
			docker logs --tail 30 "$id" >&2 2>&1 || true
			tn_die "$n keeps exiting"
		fi
		[ $SECONDS -lt $deadline ] || { docker logs --tail 30 "$id" >&2 2>&1 || true; tn_die "$n's node did not come up"; }
		sleep 1
	done
done
want=$(($(wc -w <<<"$expected") - 1))
while :; do
	seen=$(tn_status_json boot-1 | grep -c '^      "peer_id"' || true)
	[ "$seen" -ge "$want" ] && break
	[ $SECONDS -lt $deadline ] || { tn_log "warning: boot-1 sees $seen of $want peers after waiting; carrying on"; break; }
	sleep 2
done

for r in router-a router-b router-c; do
	tn_log "$r: $(docker exec "$(tn_cid "$r")" router status)"
done
tn_log "testnet up in $((SECONDS - started)) s: $(wc -w <<<"$expected") nodes; boot-1 sees $seen peers"
tn_log "next: testnet/status.sh | testnet/chaos.sh help | testnet/down.sh"
