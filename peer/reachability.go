package peer

import (
	"fmt"
	"net"
	"slices"

	"github.com/libp2p/go-libp2p/core/network"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Reachability decisions live here, in one place.
//
// go-libp2p's AutoNAT (v1 and v2) wants several independent dial-back
// servers before it commits to an answer, and a young holopeer swarm often
// has a single public node: the bootstrap relay. Waiting for AutoNAT there
// means waiting forever in "unknown", with no relay service on the public
// node and no relay reservation on the private ones. So the node decides
// for itself, from evidence it already holds, and tells libp2p (relay
// service, auto-relay, the DHT) by emitting EvtLocalReachabilityChanged.
// libp2p's own AutoNAT v1 is pinned to "unknown" so that it never
// contradicts us; AutoNAT v2 still runs and its per-address verdicts are
// the strongest evidence below.
//
// The rules, strongest first (the first that applies wins):
//
//  1. Forced by the operator (--reachability public|private).
//  2. AutoNAT v2 confirmed one of our public addresses: public.
//  3. The operator announced a public address (--announce): public. They
//     forwarded a port by hand; AutoNAT v2 does not test announced
//     addresses, so an unreachable observed address does not overrule it.
//  4. AutoNAT v2 found our public addresses unreachable and none
//     reachable: private (a firewalled public IP, a broken port forward).
//  5. UPnP/NAT-PMP mapped a port on a public address: public.
//  6. We listen on a public address of our own: public.
//  7. A peer at a public address saw us at a public address that is not
//     ours: a NAT sits between us and the internet: private.
//  8. We have no public address and talk to peers at public addresses
//     (bootstrap or connected): private. This is the start-up presumption
//     of a home node, before any peer has observed it.
//  9. Otherwise nothing is NATed between us and our peers (a LAN, a
//     loopback testnet): unknown. Such a node serves the DHT, takes no
//     relay reservations and runs no relay service.
//
// Consequences elsewhere: public nodes run the relay service (unless
// refused) and serve the DHT; private nodes take relay reservations and
// stay DHT clients; unknown nodes serve the DHT (ModeAutoServer), which is
// right for a LAN where every node can dial every other.

// reachEvidence is what the node knows when it decides.
type reachEvidence struct {
	Forced      network.Reachability // ReachabilityUnknown when not forced
	Announced   []ma.Multiaddr       // --announce addresses
	Own         []ma.Multiaddr       // our interface listen addresses
	Mapped      []ma.Multiaddr       // external addresses from UPnP/NAT-PMP
	Reachable   []ma.Multiaddr       // AutoNAT v2: confirmed reachable
	Unreachable []ma.Multiaddr       // AutoNAT v2: confirmed unreachable
	Observed    []observation        // how peers see us (identify)
	PublicPeers bool                 // a bootstrap or connected peer has a public address
}

// reachVerdict is a decision and the evidence it rests on, in words.
type reachVerdict struct {
	Reachability network.Reachability
	Reason       string
}

func (v reachVerdict) String() string { return reachString(v.Reachability) + ": " + v.Reason }

func decideReachability(e reachEvidence) reachVerdict {
	if e.Forced != network.ReachabilityUnknown {
		return reachVerdict{e.Forced, "set by the operator (--reachability)"}
	}
	if a := firstPublic(e.Reachable); a != nil {
		return reachVerdict{network.ReachabilityPublic, fmt.Sprintf("AutoNAT v2 confirmed %s is reachable", a)}
	}
	if a := firstPublic(e.Announced); a != nil {
		return reachVerdict{network.ReachabilityPublic, fmt.Sprintf("announced public address %s", a)}
	}
	if a := firstPublic(e.Unreachable); a != nil {
		return reachVerdict{network.ReachabilityPrivate, fmt.Sprintf("AutoNAT v2 found %s unreachable from outside", a)}
	}
	if a := firstPublic(e.Mapped); a != nil {
		return reachVerdict{network.ReachabilityPublic, fmt.Sprintf("router mapped port %s (UPnP/NAT-PMP)", a)}
	}
	if a := firstPublic(e.Own); a != nil {
		return reachVerdict{network.ReachabilityPublic, fmt.Sprintf("listening on public address %s", a)}
	}
	own := ownIPs(e.Own)
	for _, o := range e.Observed {
		if !manet.IsPublicAddr(o.Observer) || !manet.IsPublicAddr(o.Observed) {
			continue
		}
		if ip, err := manet.ToIP(o.Observed); err == nil && !slices.ContainsFunc(own, ip.Equal) {
			return reachVerdict{network.ReachabilityPrivate, fmt.Sprintf("behind NAT: %s sees us as %s", o.Observer, o.Observed)}
		}
	}
	if e.PublicPeers {
		return reachVerdict{network.ReachabilityPrivate, "no public address of our own while our peers are on the internet"}
	}
	return reachVerdict{network.ReachabilityUnknown, "no NAT between us and our peers (LAN or loopback)"}
}

func firstPublic(addrs []ma.Multiaddr) ma.Multiaddr {
	for _, a := range addrs {
		if !isRelayAddr(a) && manet.IsPublicAddr(a) {
			return a
		}
	}
	return nil
}

func ownIPs(addrs []ma.Multiaddr) []net.IP {
	var out []net.IP
	for _, a := range addrs {
		if ip, err := manet.ToIP(a); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// anyPublic reports whether any of the peers' addresses is public.
func anyPublic(addrs []ma.Multiaddr) bool { return firstPublic(addrs) != nil }
