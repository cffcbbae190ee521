#!/usr/bin/env bash
# natlab.sh: a NAT lab on one machine, built from network namespaces, veth
# pairs and iptables. Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN).
#
#   "internet" 7.7.7.0/24 (a bridge in its own namespace; no route out)
#     pub1  7.7.7.1     public node: the bootstrap and relay
#     pub2  7.7.7.2     more public nodes (--public N)
#     rt1   7.7.7.11 ── 10.0.1.1   home router, NAT type easy|symmetric
#                         home1 10.0.1.2 (default route via rt1)
#     rt2   7.7.7.12 ── 10.0.2.1
#                         home2 10.0.2.2
#     ...
#
# The internet segment uses a public-looking range on purpose: go-libp2p
# only hole-punches and takes relay reservations over public addresses, and
# it treats 10/8, 192.168/16 and the documentation ranges as private. The
# range exists only inside these namespaces: nothing is added to the
# machine's own network namespace, so no test packet can leave the machine.
#
# NAT types (each home router masquerades its LAN behind its WAN address):
#   easy       endpoint-independent mapping (Linux keeps the source port),
#              address-and-port-dependent filtering (conntrack): a typical
#              home router. Hole punching works.
#   symmetric  endpoint-dependent mapping (MASQUERADE --random-fully: a new
#              port per connection). Hole punching cannot work.
# Both drop unsolicited inbound packets addressed to the router itself
# (INPUT), as home routers do. A router that answered them would reset an
# early punch packet, or keep a conntrack entry for it that makes
# masquerade pick a new port, and an easy NAT would act symmetric.
#
# Usage:
#   natlab.sh check                 exit 0 if the lab can run here, else say why
#   natlab.sh up --prefix P [--public N] [--home easy|symmetric]... [--delay MS]
#                                   build it; print KEY=VALUE lines (below)
#   natlab.sh down --prefix P       remove what 'up' built under prefix P
#   natlab.sh run [up options] -- COMMAND [ARG...]
#                                   build a lab with a fresh prefix, run
#                                   COMMAND with the KEY=VALUE lines in its
#                                   environment, and remove the lab when it
#                                   ends or is interrupted
#
# Output of up: NATLAB_PREFIX, NATLAB_PUBLIC, NATLAB_HOMES, and for each
# public node i: PUBi_NS, PUBi_IP; for each home j: HOMEj_NS, HOMEj_IP,
# HOMEj_NAT, HOMEj_ROUTER_NS, HOMEj_WAN_IP. Run a program inside with
# 'ip netns exec "$HOME1_NS" program'.
#
# Clean-up touches only what this script created: the namespaces it
# recorded in its state file (the veth pairs and the bridge live inside
# them and go with them), after stopping the processes left inside them.
set -euo pipefail

STATE_DIR=${NATLAB_STATE_DIR:-/run/holopeer-natlab}
INET_NET=7.7.7
prog=$(basename "$0")

die() { echo "$prog: $*" >&2; exit 1; }

check() {
	[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces and iptables)"; return 1; }
	local t
	for t in ip iptables; do
		command -v "$t" >/dev/null || { echo "needs $t (apt-get install iproute2 iptables)"; return 1; }
	done
	local ns="natlabcheck$$"
	ip netns add "$ns" 2>/dev/null || { echo "cannot create a network namespace here"; return 1; }
	local ok=0
	ip netns exec "$ns" iptables -t nat -A POSTROUTING -o lo -j MASQUERADE --random-fully 2>/dev/null || ok=1
	ip netns del "$ns"
	[ $ok = 0 ] || { echo "iptables cannot masquerade inside a namespace (nat modules missing?)"; return 1; }
}

# forwarding sets IPv4 forwarding in a namespace (/proc/sys/net follows the
# reader's namespace; no sysctl binary needed).
forwarding() { ip netns exec "$1" sh -c "echo $2 >/proc/sys/net/ipv4/ip_forward"; }

statefile() { echo "$STATE_DIR/$1.ns"; }

valid_prefix() {
	[[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.]{0,30}$ ]] || die "prefix '$1': use 1-31 letters, digits, '_' or '.'"
}

# mkns creates a namespace, records it for clean-up, and brings up lo.
mkns() {
	ip netns add "$1"
	echo "$1" >>"$(statefile "$PREFIX")"
	ip -n "$1" link set lo up
}

down() {
	local prefix=$1 f ns
	valid_prefix "$prefix"
	f=$(statefile "$prefix")
	[ -f "$f" ] || return 0
	# Stop what still runs inside our namespaces (only ours: they are
	# named in our state file), then remove the namespaces.
	while read -r ns; do
		[ -n "$ns" ] || continue
		local pids
		pids=$(ip netns pids "$ns" 2>/dev/null || true)
		[ -z "$pids" ] || kill -TERM $pids 2>/dev/null || true
	done <"$f"
	local i
	for i in 1 2 3 4 5 6 7 8 9 10; do
		local left=""
		while read -r ns; do
			[ -n "$ns" ] && left+=$(ip netns pids "$ns" 2>/dev/null || true)
		done <"$f"
		[ -z "$left" ] && break
		sleep 0.2
	done
	while read -r ns; do
		[ -n "$ns" ] || continue
		local pids
		pids=$(ip netns pids "$ns" 2>/dev/null || true)
		[ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done <"$f"
	rm -f "$f"
}

up() {
	local public=1 delay=0
	local -a homes=()
	PREFIX=""
	while [ $# -gt 0 ]; do
		case $1 in
		--prefix) PREFIX=$2; shift 2 ;;
		--public) public=$2; shift 2 ;;
		--home) homes+=("$2"); shift 2 ;;
		--delay) delay=$2; shift 2 ;;
		*) die "up: unknown option $1" ;;
		esac
	done
	[ -n "$PREFIX" ] || die "up: --prefix is required"
	valid_prefix "$PREFIX"
	[[ $public =~ ^[1-9]$ ]] || die "up: --public takes 1 to 9"
	[[ $delay =~ ^[0-9]+$ ]] || die "up: --delay takes milliseconds"
	[ ${#homes[@]} -ge 1 ] && [ ${#homes[@]} -le 9 ] || die "up: give 1 to 9 --home easy|symmetric"
	local t
	for t in "${homes[@]}"; do
		[ "$t" = easy ] || [ "$t" = symmetric ] || die "up: NAT type '$t': use easy or symmetric"
	done
	mkdir -p "$STATE_DIR"
	[ ! -e "$(statefile "$PREFIX")" ] || die "up: a lab with prefix $PREFIX exists; run '$prog down --prefix $PREFIX'"
	: >"$(statefile "$PREFIX")"
	# Whatever happens before the lab is complete, leave nothing behind.
	# PREFIX is global: the EXIT trap runs after this function returns.
	trap 'down "$PREFIX"' EXIT
	trap 'exit 130' INT TERM HUP

	local inet="$PREFIX-inet"
	mkns "$inet"
	forwarding "$inet" 0
	ip -n "$inet" link add sw type bridge
	ip -n "$inet" link set sw up
	# The "internet" gateway: a default route for the public side that
	# leads nowhere, as nothing beyond this segment exists.
	ip -n "$inet" addr add "$INET_NET.254/24" dev sw

	local out="NATLAB_PREFIX=$PREFIX
NATLAB_PUBLIC=$public
NATLAB_HOMES=${#homes[@]}"
	local i
	for ((i = 1; i <= public; i++)); do
		local ns="$PREFIX-pub$i"
		mkns "$ns"
		ip -n "$ns" link add eth0 type veth peer name "pub$i" netns "$inet"
		ip -n "$inet" link set "pub$i" master sw up
		ip -n "$ns" addr add "$INET_NET.$i/24" dev eth0
		ip -n "$ns" link set eth0 up
		ip -n "$ns" route add default via "$INET_NET.254"
		out+="
PUB${i}_NS=$ns
PUB${i}_IP=$INET_NET.$i"
	done

	local j=0
	for t in "${homes[@]}"; do
		j=$((j + 1))
		local rt="$PREFIX-rt$j" home="$PREFIX-home$j" wan="$INET_NET.$((10 + j))" lan="10.0.$j"
		mkns "$rt"
		mkns "$home"
		ip -n "$rt" link add wan0 type veth peer name "rt$j" netns "$inet"
		ip -n "$inet" link set "rt$j" master sw up
		ip -n "$rt" addr add "$wan/24" dev wan0
		ip -n "$rt" link set wan0 up
		ip -n "$rt" route add default via "$INET_NET.254"
		ip -n "$home" link add eth0 type veth peer name lan0 netns "$rt"
		ip -n "$rt" addr add "$lan.1/24" dev lan0
		ip -n "$rt" link set lan0 up
		ip -n "$home" addr add "$lan.2/24" dev eth0
		ip -n "$home" link set eth0 up
		ip -n "$home" route add default via "$lan.1"

		forwarding "$rt" 1
		local rnd=()
		[ "$t" = symmetric ] && rnd=(--random-fully)
		ip netns exec "$rt" iptables -t nat -A POSTROUTING -s "$lan.0/24" -o wan0 -j MASQUERADE "${rnd[@]}"
		ip netns exec "$rt" iptables -P FORWARD DROP
		ip netns exec "$rt" iptables -A FORWARD -i lan0 -o wan0 -j ACCEPT
		ip netns exec "$rt" iptables -A FORWARD -i wan0 -o lan0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
		ip netns exec "$rt" iptables -A INPUT -i wan0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
		ip netns exec "$rt" iptables -A INPUT -i wan0 -j DROP
		if [ "$delay" -gt 0 ]; then
			# Half the round trip on each side of the router.
			ip netns exec "$rt" tc qdisc add dev wan0 root netem delay "$((delay / 2))ms"
			ip netns exec "$rt" tc qdisc add dev lan0 root netem delay "$((delay / 2))ms"
		fi
		out+="
HOME${j}_NS=$home
HOME${j}_IP=$lan.2
HOME${j}_NAT=$t
HOME${j}_ROUTER_NS=$rt
HOME${j}_WAN_IP=$wan"
	done
	trap - EXIT INT TERM HUP
	echo "$out"
}

run() {
	local -a upargs=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		upargs+=("$1")
		shift
	done
	[ "${1:-}" = -- ] || die "run: put the command after --"
	shift
	[ $# -gt 0 ] || die "run: no command given"
	# Global: the EXIT trap runs after this function has returned.
	RUN_PREFIX="hpnat$$"
	trap 'down "$RUN_PREFIX"' EXIT
	trap 'exit 130' INT TERM HUP
	local env
	env=$(up --prefix "$RUN_PREFIX" "${upargs[@]}")
	local line
	while read -r line; do
		export "${line?}"
	done <<<"$env"
	"$@"
}

case ${1:-} in
check) check ;;
up) shift; up "$@" ;;
down)
	shift
	[ "${1:-}" = --prefix ] && [ -n "${2:-}" ] || die "down: use --prefix P"
	down "$2"
	;;
run) shift; run "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
