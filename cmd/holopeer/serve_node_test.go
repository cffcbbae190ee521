package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lpeer "github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/holopeer/holopeer/gossip"
	hpeer "github.com/holopeer/holopeer/peer"
	"github.com/holopeer/holopeer/peer/node"
	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// TestServeTrainedOnNodes runs what `holopeer testnet --serve` does after
// training, on real nodes in this process: three compute nodes (one with
// the sim TEE stands as coordinator) and a researcher's node elect, place
// the checkpoint's blocks, and the researcher answers a streaming
// completion with what one process generates.
func TestServeTrainedOnNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	loop, _ := ma.NewMultiaddr("/ip4/127.0.0.1/tcp/0")
	timing := &gossip.Timing{Tick: 20 * time.Millisecond, Presence: 200 * time.Millisecond}
	start := func(tee string, boot []lpeer.AddrInfo) *node.Node {
		t.Helper()
		n, err := node.Start(ctx, node.Config{
			DataDir: t.TempDir(), Swarm: "serve-test", Listen: []ma.Multiaddr{loop}, Bootstrap: boot, API: "off",
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
	nodes := []*node.Node{first, start("none", boot), start("none", boot)}
	researcher := start("none", boot)
	for {
		c := researcher.Gossip().Coordinator()
		if c != nil && len(first.Gossip().Presence()) >= 3 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no coordinator elected, or the nodes did not see each other")
		case <-time.After(50 * time.Millisecond):
		}
	}

	dir := t.TempDir()
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 3, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 64}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	serveTestModel(t, m)
	final := checkpointtest.Save(t, filepath.Join(dir, "final"), []*model.Stage{m.Stage}, checkpoint.WithTokenizer(tokenizer.Byte()))
	train, err := manifest.Parse([]byte("name: tiny\ntokenizer: byte\nmodel: {dim: 32, layers: 3, heads: 4, kv_heads: 2, ffn_dim: 64, max_seq: 64}\npipeline: {stages: 3, codec: fp32}\n"))
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- serveTrained(sctx, researcher, train, final, serveOptions{HTTP: "127.0.0.1:0", Stdout: &out, Logger: quietLogger(), Ready: func(u string) { ready <- u }})
	}()
	var base string
	select {
	case base = <-ready:
	case err := <-done:
		t.Fatalf("serving stopped: %v\n%s", err, out.String())
	case <-ctx.Done():
		t.Fatalf("not serving in time\n%s", out.String())
	}
	got, err := streamCompletion(base, "hello there", 20)
	if err != nil {
		t.Fatal(err)
	}
	if want := localText(t, m.Stage, "hello there", 20); got != want {
		t.Fatalf("%q through the swarm, %q in one process", got, want)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if !strings.Contains(out.String(), n.Host().ID().String()) {
			t.Fatalf("node %s holds no stage:\n%s", n.Host().ID(), out.String())
		}
	}
	t.Logf("\n%s", out.String())
}
