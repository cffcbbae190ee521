#!/usr/bin/env bash
# The container testnet as its bootstrap sees it: every node, where it sits
# (internet or behind which router and NAT), whether the bootstrap reaches it
# directly or through a relay, the coordinator; then every node's own links
# as a matrix (direct / relayed), and the routers' state.
#
#   testnet/status.sh [--from NAME] [--json] [--raw NAME]
#
#   --from NAME  see the swarm as NAME does instead of boot-1
#   --json       the same facts as JSON (e2e.sh reads this)
#   --raw NAME   NAME's own `holopeer status` table
# Needs python3 on the host for the table; without it, prints each node's
# `holopeer status` instead.
set -euo pipefail
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/docker/lib.sh"

from="" json=0
while [ $# -gt 0 ]; do
	case $1 in
	--from) from=${2:?--from needs a node name}; shift 2 ;;
	--json) json=1; shift ;;
	--raw)
		id=$(tn_cid "${2:?--raw needs a node name}") || tn_die "no testnet node ${2}"
		exec docker exec "$id" /holopeer status
		;;
	-h | --help) tn_usage "$0"; exit 0 ;;
	*) tn_die "unknown argument $1 (see testnet/status.sh --help)" ;;
	esac
done

tn_docker_ok || tn_die "no Docker engine answers (docker info failed)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tn_containers all >"$tmp/containers"
[ -s "$tmp/containers" ] || tn_die "no testnet is running (start one with testnet/up.sh)"
[ -f "$TN_RUN/peers" ] && cp "$TN_RUN/peers" "$tmp/peers"

# Ask every running node (in parallel) and every router.
while read -r name id _ role _ _ state; do
	if [ "$role" = router ]; then
		if [ "$state" = running ]; then
			echo "$name $(timeout 10 docker exec "$id" router status 2>/dev/null || echo '(no answer)')" >>"$tmp/routers"
		else
			echo "$name ($state)" >>"$tmp/routers"
		fi
	elif [ "$state" = running ]; then
		(timeout 15 docker exec "$id" /holopeer status --json >"$tmp/$name.json" 2>/dev/null || rm -f "$tmp/$name.json") &
	fi
done <"$tmp/containers"
wait

# Remember peer ids so names resolve while a node is down.
for f in "$tmp"/*.json; do
	[ -e "$f" ] || continue
	name=$(basename "$f" .json)
	id=$(sed -n 's/^  "peer_id": "\(.*\)",$/\1/p' "$f" | head -n1)
	[ -n "$id" ] && ! grep -q "^$name $id$" "$TN_RUN/peers" 2>/dev/null && echo "$name $id" >>"$TN_RUN/peers"
done
[ -f "$TN_RUN/peers" ] && cp "$TN_RUN/peers" "$tmp/peers"

if command -v python3 >/dev/null; then
	args=("$tmp")
	[ -n "$from" ] && args+=(--from "$from")
	[ $json = 1 ] && args+=(--json)
	python3 "$TN_DIR/tn.py" status "${args[@]}"
else
	[ $json = 0 ] || tn_die "--json needs python3"
	for f in "$tmp"/*.json; do
		name=$(basename "$f" .json)
		echo "== $name"
		docker exec "$(tn_cid "$name")" /holopeer status || true
	done
fi
