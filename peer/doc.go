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
package peer
