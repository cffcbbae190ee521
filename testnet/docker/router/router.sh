#!/bin/bash
# A home router of the holopeer testnet. Runs in the router image (Debian
# minbase + iproute2 + nftables); the container sits on the "internet"
# network (WAN, TN_WAN_IP) and on its home's docker LAN network (TN_LAN_IP).
#
#   router start      set up the home LAN, NAT and shaping, then idle (entry point)
#   router cut        drop everything on the WAN side (the home's uplink is cut)
#   router restore    undo cut
#   router status     one line: nat, addresses, shaping, cut or not
#
# Why the home LAN is a VXLAN overlay (vx0) and not the docker LAN itself:
# Docker installs, for every internal network, host rules that drop packets
# entering its bridge with a destination outside its subnet (and leaving it
# with a source outside it). Bridged traffic goes through those rules
# (br_netfilter, on wherever Docker runs with iptables), so a node's packet
# to 7.7.7.2 sent via this router's LAN address dies at the host bridge. A
# VXLAN tunnel keeps the outer headers inside the LAN subnet: nodes put their
# internet traffic into vx0, this router takes it out of vx0, NATs it and
# forwards it to the internet network. Nothing on the host is changed.
#
# NAT behaviour (TN_NAT):
#   cone       masquerade keeps the source port when it is free: one mapping
#              per inside address and port for every destination
#              (endpoint-independent), so hole punching works.
#   symmetric  masquerade random,fully-random: a fresh random port for every
#              new flow, so the port a peer learns from one destination is
#              useless for another; hole punching fails, relays must carry it.
# Both filter inbound like a home router: only replies to flows opened from
# inside are forwarded, and nothing unsolicited reaches the router itself.
set -euo pipefail

: "${TN_NAT:?cone or symmetric}" "${TN_WAN_IP:?}" "${TN_LAN_IP:?}" "${TN_VNI:?}" "${TN_OVERLAY:?e.g. 10.177.1}"
STATE=/run/tn-router
mkdir -p "$STATE"

log() { echo "router[$(hostname)]: $*" >&2; }

# iface_of IP prints the interface holding IP. Docker does not promise which
# of the two networks becomes eth0, so interfaces are found by address.
iface_of() {
	ip -4 -o addr show | awk -v want="$1" '{ split($4, a, "/"); if (a[1] == want) { print $2; exit } }'
}

wan_if() {
	local i
	i=$(iface_of "$TN_WAN_IP")
	[ -n "$i" ] || { log "no interface has the WAN address $TN_WAN_IP"; exit 1; }
	echo "$i"
}

# shape WAN_IF: TN_WAN_SHAPE is RATE:DELAY (either part may be empty), e.g.
# 80mbit:40ms. DELAY is added to each round trip through this router (half
# on the way out, half on the way in); RATE caps each direction. tc shapes
# only egress, so the WAN interface carries the upload and vx0 the download.
shape() {
	local wan=$1 spec=${TN_WAN_SHAPE:-} rate delay half args
	[ -n "$spec" ] || { echo "none" >"$STATE/shape"; return 0; }
	rate=${spec%%:*}
	delay=""
	[[ $spec == *:* ]] && delay=${spec#*:}
	if [ -n "$rate" ] && ! [[ $rate =~ ^[0-9]+(kbit|mbit|gbit)$ ]]; then log "bad rate '$rate' in TN_WAN_SHAPE=$spec (want e.g. 80mbit)"; exit 1; fi
	if [ -n "$delay" ] && ! [[ $delay =~ ^[0-9]+ms$ ]]; then log "bad delay '$delay' in TN_WAN_SHAPE=$spec (want e.g. 40ms)"; exit 1; fi
	half=$(( ${delay%ms} / 2 ))
	args=()
	[ -n "$delay" ] && args+=(delay "${half}ms")
	[ -n "$rate" ] && args+=(rate "$rate")
	if tc qdisc replace dev "$wan" root netem "${args[@]}" 2>/dev/null &&
		tc qdisc replace dev vx0 root netem "${args[@]}"; then
		echo "netem ${args[*]} each way" >"$STATE/shape"
		return 0
	fi
	# Some kernels are built without sch_netem. Bandwidth can still be capped
	# with tbf; latency cannot, and that is said plainly.
	tc qdisc del dev "$wan" root 2>/dev/null || true
	if [ -n "$rate" ]; then
		tc qdisc replace dev "$wan" root tbf rate "$rate" burst 64kb latency 400ms
		tc qdisc replace dev vx0 root tbf rate "$rate" burst 64kb latency 400ms
		echo "tbf rate $rate each way; NO LATENCY: this kernel has no netem qdisc" >"$STATE/shape"
	else
		echo "NONE: this kernel has no netem qdisc, so no latency can be added" >"$STATE/shape"
	fi
	log "$(cat "$STATE/shape")"
}

start() {
	local wan lan masq
	wan=$(wan_if)
	lan=$(iface_of "$TN_LAN_IP")
	[ -n "$lan" ] || { log "no interface has the LAN address $TN_LAN_IP"; exit 1; }
	case $TN_NAT in
	cone) masq="masquerade" ;;
	symmetric) masq="masquerade random,fully-random" ;;
	*) log "TN_NAT=$TN_NAT: want cone or symmetric"; exit 1 ;;
	esac

	# Docker gives every container a default route to the host bridge; a
	# home router on this "internet" has no upstream beyond it.
	ip route del default 2>/dev/null || true

	# The home LAN: a VXLAN hub; nodes' tunnel endpoints are learned from
	# the packets they send (each node pings the router before starting).
	ip link del vx0 2>/dev/null || true
	ip link add vx0 type vxlan id "$TN_VNI" dstport 4789 dev "$lan" local "$TN_LAN_IP" ageing 86400
	ip addr add "$TN_OVERLAY.1/24" dev vx0
	ip link set vx0 up

	nft -f - <<EOF
table inet tn_router
delete table inet tn_router
table inet tn_router {
	chain input {
		type filter hook input priority filter; policy drop;
		ct state established,related accept
		ct state invalid drop
		iifname "lo" accept
		iifname "vx0" accept
		iifname "$lan" accept
		# Anything else, notably unsolicited packets from the internet, is dropped.
	}
	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept
		iifname "vx0" oifname "$wan" accept
		iifname "vx0" oifname "vx0" accept
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "$wan" ip saddr $TN_OVERLAY.0/24 $masq
	}
}
EOF
	shape "$wan"
	echo "$TN_NAT" >"$STATE/nat"
	touch /run/router-ready
	log "up: nat $TN_NAT, wan $wan $TN_WAN_IP, home LAN $TN_OVERLAY.0/24 on vx0 (vni $TN_VNI over $lan), shaping: $(cat "$STATE/shape")"

	trap 'exit 0' TERM INT
	sleep infinity &
	wait $!
}

cut() {
	local wan
	wan=$(wan_if)
	nft -f - <<EOF
table inet tn_cut
delete table inet tn_cut
table inet tn_cut {
	chain in {
		type filter hook prerouting priority -300; policy accept;
		iifname "$wan" drop
	}
	chain out {
		type filter hook postrouting priority 300; policy accept;
		oifname "$wan" drop
	}
}
EOF
	touch "$STATE/cut"
	log "WAN link cut"
}

restore() {
	nft delete table inet tn_cut 2>/dev/null || true
	rm -f "$STATE/cut"
	log "WAN link restored"
}

status() {
	local cut=up
	[ -f "$STATE/cut" ] && cut=CUT
	echo "nat=$(cat "$STATE/nat" 2>/dev/null || echo '?') wan=$TN_WAN_IP lan=$TN_OVERLAY.0/24 link=$cut shaping=$(cat "$STATE/shape" 2>/dev/null || echo '?')"
}

case ${1:-start} in
start) start ;;
cut) cut ;;
restore) restore ;;
status) status ;;
*) echo "usage: router start|cut|restore|status" >&2; exit 2 ;;
esac
