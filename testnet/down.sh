#!/usr/bin/env bash
# Tear the container testnet down: its containers, its networks and the
# images built for this run. The cached Debian base image stays (so the next
# up.sh skips debootstrap) unless --purge is given. Touches nothing that is
# not labelled as the testnet's. Exits non-zero if anything of ours is left.
#
#   testnet/down.sh [--purge]
set -euo pipefail
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/docker/lib.sh"

purge=0
case ${1:-} in
--purge) purge=1 ;;
"") ;;
-h | --help) tn_usage "$0"; exit 0 ;;
*) tn_die "unknown argument $1 (usage: down.sh [--purge])" ;;
esac

tn_docker_ok || tn_die "no Docker engine answers (docker info failed)"

# Containers and networks: compose first, then anything carrying our labels
# that compose did not know about (a run with another compose file or an
# interrupted start).
tn_compose down --remove-orphans --volumes --timeout 3 >/dev/null 2>&1 || true
ids=$( { docker ps -aq --filter "label=com.docker.compose.project=$TN_PROJECT"; docker ps -aq --filter "label=$TN_LABEL"; } | sort -u)
[ -z "$ids" ] || docker rm -f $ids >/dev/null
nets=$( { docker network ls -q --filter "label=com.docker.compose.project=$TN_PROJECT"; docker network ls -q --filter "label=$TN_LABEL"; } | sort -u)
[ -z "$nets" ] || docker network rm $nets >/dev/null

# Images of this run (removing a tagged image removes its untagged layers).
for ref in "$TN_NODE_IMAGE" "$TN_LAN_IMAGE" "$TN_ROUTER_IMAGE"; do
	docker rmi -f "$ref" >/dev/null 2>&1 || true
done
if [ $purge = 1 ]; then
	docker images --filter "reference=$TN_PROJECT/base" --format '{{.Repository}}:{{.Tag}}' | xargs -r docker rmi >/dev/null
fi
# Layers left untagged by an interrupted build carry our labels.
tn_leftovers | awk '$1 == "image" { print $NF }' | xargs -r docker rmi -f >/dev/null 2>&1 || true

rm -rf "$TN_RUN" "$TN_BUILD"/ctx-*

left=$(tn_leftovers | sort -u)
if [ -n "$left" ]; then
	tn_log "still present after teardown:"
	echo "$left" >&2
	exit 1
fi
kept=$(docker images --filter "reference=$TN_PROJECT/base" --format '{{.Repository}}:{{.Tag}}' | tr '\n' ' ')
tn_log "testnet down; nothing of it is left${kept:+ but the cached base image $kept}"
