#!/usr/bin/env bash
# Break the container testnet on purpose, and mend it.
#
#   testnet/chaos.sh kill NAME      crash NAME (SIGKILL); it stays down until start
#   testnet/chaos.sh stop NAME      stop NAME cleanly (SIGTERM)
#   testnet/chaos.sh start NAME     start a killed or stopped NAME again (same identity)
#   testnet/chaos.sh pause NAME     freeze NAME: its connections stay open but it says nothing
#   testnet/chaos.sh unpause NAME
#   testnet/chaos.sh cut ROUTER     cut ROUTER's internet link: its whole home goes dark
#   testnet/chaos.sh restore [NAME] undo whatever was done to NAME (start, unpause,
#                                   reconnect); without NAME, to everything
#   testnet/chaos.sh list           every node and router and its state
#
# NAME is a node (boot-1, pub-2, stage-b-1, researcher, ...) or a router
# (router-a, router-b, router-c); `list` shows them.
set -euo pipefail
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/docker/lib.sh"

usage() { tn_usage "$0"; }

tn_docker_ok || tn_die "no Docker engine answers (docker info failed)"

action=${1:-}
name=${2:-}
[ -n "$action" ] || { usage; exit 2; }

id_of() {
	tn_cid "$1" || tn_die "no testnet container '$1' (testnet/chaos.sh list shows them)"
}
state_of() { docker inspect --format '{{.State.Status}}' "$1"; }
is_router() { tn_containers all | awk -v n="$1" '$1 == n && $4 == "router" { f = 1 } END { exit !f }'; }

restore_one() {
	local n=$1 id st
	id=$(id_of "$n")
	st=$(state_of "$id")
	case $st in
	paused) docker unpause "$id" >/dev/null && tn_log "$n unpaused" ;;
	exited | created | dead) docker start "$id" >/dev/null && tn_log "$n started" ;;
	esac
	if is_router "$n" && [ "$(state_of "$id")" = running ] &&
		docker exec "$id" test -f /run/tn-router/cut 2>/dev/null; then
		docker exec "$id" router restore && tn_log "$n link restored"
	fi
}

case $action in
kill)
	id=$(id_of "${name:?kill needs a name}")
	docker kill "$id" >/dev/null
	tn_log "$name killed (SIGKILL); 'testnet/chaos.sh start $name' brings it back"
	;;
stop)
	id=$(id_of "${name:?stop needs a name}")
	docker stop -t 5 "$id" >/dev/null
	tn_log "$name stopped"
	;;
start)
	id=$(id_of "${name:?start needs a name}")
	docker start "$id" >/dev/null
	tn_log "$name started"
	;;
pause)
	id=$(id_of "${name:?pause needs a name}")
	docker pause "$id" >/dev/null
	tn_log "$name paused"
	;;
unpause)
	id=$(id_of "${name:?unpause needs a name}")
	docker unpause "$id" >/dev/null
	tn_log "$name unpaused"
	;;
cut)
	is_router "${name:?cut needs a router name}" || tn_die "$name is not a router (router-a, router-b, router-c)"
	docker exec "$(id_of "$name")" router cut
	;;
restore)
	if [ -n "$name" ]; then
		restore_one "$name"
	else
		for n in $(tn_containers all | awk '{ print $1 }'); do restore_one "$n"; done
	fi
	;;
list)
	printf '%-11s %-10s %-9s %-10s %s\n' NAME ROLE WHERE NAT STATE
	tn_containers all | while read -r n id _ role site nat st; do
		if [ "$role" = router ] && [ "$st" = running ] && docker exec "$id" test -f /run/tn-router/cut 2>/dev/null; then
			st="running, link CUT"
		fi
		printf '%-11s %-10s %-9s %-10s %s\n' "$n" "$role" "$site" "$nat" "$st"
	done
	;;
-h | --help | help) usage ;;
*) usage; exit 2 ;;
esac
