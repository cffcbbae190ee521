#!/bin/bash
# Entry point of a holopeer node behind a testnet home router.
#
#   lan-node up ARGS...   join the home LAN, then exec `/holopeer up ARGS...
#                         --listen <this node's port>`
#   lan-node idle         join the home LAN and wait (a machine where commands
#                         are run with docker exec)
#
# The home LAN is a VXLAN overlay (vx0) carried over the docker LAN network,
# with the router as its hub; router.sh says why. The node's default route
# goes into vx0, so everything bound for the internet passes the router's NAT.
#
# Every node behind a router listens on its own port (TN_PORT_BASE plus the
# last byte of its address), as machines behind one home router do: two
# inside hosts on the same port would make even a "cone" NAT hand out
# different outside ports per destination whenever their flows collide.
set -euo pipefail

: "${TN_ROUTER:?address of the router on the docker LAN}" "${TN_VNI:?}" "${TN_OVERLAY:?e.g. 10.177.1}"
port_base=${TN_PORT_BASE:-7600}

log() { echo "lan-node[$(hostname)]: $*" >&2; }

underlay_if=$(ip -4 -o route get "$TN_ROUTER" | sed -n 's/.* dev \([^ ]*\).*/\1/p')
underlay_ip=$(ip -4 -o addr show dev "$underlay_if" | awk '{ split($4, a, "/"); print a[1]; exit }')
host=${underlay_ip##*.}
home_ip=$TN_OVERLAY.$host

ip link del vx0 2>/dev/null || true
ip link add vx0 type vxlan id "$TN_VNI" remote "$TN_ROUTER" dstport 4789 dev "$underlay_if"
ip addr add "$home_ip/24" dev vx0
ip link set vx0 up
ip route replace default via "$TN_OVERLAY.1" dev vx0

# The router learns where this node's tunnel ends from the first packet it
# gets; ping until it answers (it may still be setting up).
ok=0
for _ in $(seq 1 60); do
	if ping -c1 -W1 -q "$TN_OVERLAY.1" >/dev/null 2>&1; then ok=1; break; fi
	sleep 0.5
done
[ "$ok" = 1 ] || { log "router $TN_OVERLAY.1 does not answer through the tunnel"; exit 1; }

mkdir -p /data
port=$((port_base + host))
echo "$port" >/run/tn-port
log "home address $home_ip (docker LAN $underlay_ip), default route via $TN_OVERLAY.1, port $port"

case ${1:-idle} in
up)
	shift
	exec /holopeer up "$@" --listen "/ip4/0.0.0.0/tcp/$port,/ip4/0.0.0.0/udp/$port/quic-v1"
	;;
idle)
	trap 'exit 0' TERM INT
	sleep infinity &
	wait $!
	;;
*)
	exec "$@"
	;;
esac
