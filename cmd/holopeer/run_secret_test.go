package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/manifest"
)

// TestRunKeepsPseudonymKeysApart: two subspace jobs of one researcher,
// even into the same output directory, run under different pseudonym
// keys, and no export holds its key (it stays in the run's directory,
// beside final/).
func TestRunKeepsPseudonymKeysApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, researcher := startTestSwarm(t, ctx, "secret-test", 2)
	m, err := manifest.Parse([]byte(`name: secret
tokenizer: byte
model: {dim: 32, layers: 2, heads: 4, kv_heads: 2, ffn_dim: 64, max_seq: 32}
data: {synthetic: {seed: 1}}
train: {steps: 2, seq_len: 16, batch_tokens: 64, microbatches: 2}
pipeline: {stages: 2, codec: subspace, rank: 8, subspace_seed: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	var keys [2]string
	out := t.TempDir() // one output directory: the old code reused its key
	for i := range keys {
		if _, err := runJob(ctx, researcher, m, runOptions{Out: out, Stdout: io.Discard, Quiet: true}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, "pseudonyms.secret"))
		if err != nil || len(b) < 16 {
			t.Fatalf("run %d kept no key beside final/: %v", i, err)
		}
		keys[i] = string(b)
		if _, err := os.Stat(filepath.Join(out, "final", "pseudonyms.secret")); err == nil {
			t.Fatalf("run %d put its pseudonym key inside the export", i)
		}
		files, _ := os.ReadDir(filepath.Join(out, "final"))
		for _, f := range files {
			data, _ := os.ReadFile(filepath.Join(out, "final", f.Name()))
			if bytes.Contains(data, b) {
				t.Fatalf("final/%s holds the pseudonym key", f.Name())
			}
		}
	}
	if keys[0] == keys[1] {
		t.Fatal("two jobs shared one pseudonym key")
	}
}
