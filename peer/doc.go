// Package peer is a holopeer node's place in the network: its persistent
// identity, the libp2p host (TCP and QUIC, libp2p's own Noise/TLS, a
// connection manager and a resource manager with explicit limits), the
// swarm's private Kademlia DHT (protocol prefix /holopeer, never the public
// IPFS DHT), rendezvous under a key derived from the swarm name, and the
// signed capability records by which members tell each other what they
// offer.
//
// A Host is built with functional options:
//
//	h, err := peer.New(ctx,
//		peer.WithDataDir(dir),
//		peer.WithSwarm("lab"),
//		peer.WithListen(addrs...),
//		peer.WithBootstrap(boot...))
//
// Members are peers that hold a valid capability record for the same swarm
// and are connected now; Members() is what status and the placement
// planner read.
//
// NAT traversal (nat.go, reachability.go, direct.go): a node decides
// whether it is publicly reachable from evidence it holds (reachability.go
// lists the rules), because AutoNAT alone stays "unknown" in a swarm with
// one public node. Public nodes serve the DHT and relay for others
// (WithRelayService); private nodes are DHT clients, reserve relay slots
// (their bootstrap peers, WithStaticRelays, relays met in the swarm), and
// upgrade relayed connections to direct ones by hole punching (DCUtR).
// Every member is reported direct or relayed, with the reason
// (Member.RelayReason); NAT() reports reachability, NAT mapping, relays,
// relay-service counters and hole-punch history. Relayed connections are
// limited: streams cross them only when opened with
// network.WithAllowLimitedConn. The probe protocol (probe.go) checks a
// path end to end.
package peer
