package main

import (
	"context"
	"testing"
	"time"

	lpeer "github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/holopeer/holopeer/gossip"
	hpeer "github.com/holopeer/holopeer/peer"
	"github.com/holopeer/holopeer/peer/node"
)

// startTestSwarm starts compute nodes in this process on loopback (the
// first attests with sim, INSECURE, so a coordinator exists; the rest
// bootstrap from it) and a researcher's node, and returns once the
// researcher follows a coordinator and the first node sees every other.
func startTestSwarm(t *testing.T, ctx context.Context, swarm string, compute int) (nodes []*node.Node, researcher *node.Node) {
	t.Helper()
	loop, _ := ma.NewMultiaddr("/ip4/127.0.0.1/tcp/0")
	timing := &gossip.Timing{Tick: 20 * time.Millisecond, Presence: 200 * time.Millisecond}
	start := func(tee string, boot []lpeer.AddrInfo) *node.Node {
		t.Helper()
		n, err := node.Start(ctx, node.Config{
			DataDir: t.TempDir(), Swarm: swarm, Listen: []ma.Multiaddr{loop}, Bootstrap: boot, API: "off",
			Logger: quietLogger(), Offer: hpeer.Offer{MemoryBytes: 1 << 30, GFLOPS: 10},
			TEE: tee, AllowSim: true, GossipTiming: timing,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	first := start("sim", nil)
	h := first.Host().Libp2p()
	boot := []lpeer.AddrInfo{{ID: h.ID(), Addrs: h.Addrs()}}
	nodes = []*node.Node{first}
	for len(nodes) < compute {
		nodes = append(nodes, start("none", boot))
	}
	researcher = start("none", boot)
	for researcher.Gossip().Coordinator() == nil || len(first.Gossip().Presence()) < compute {
		select {
		case <-ctx.Done():
			t.Fatal("no coordinator elected, or the nodes did not see each other")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nodes, researcher
}
