package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	nodes, researcher := startTestSwarm(t, ctx, "serve-test", 3)

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
