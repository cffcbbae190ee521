package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
)

// checkpoint init writes a checkpoint of the asked shape that loads and
// generates, and refuses an unknown shape by naming the known ones.
func TestCheckpointInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	out, err := runCLI(t, "checkpoint", "init", "--shape", "demo", "--layers", "2", "--dtype", "bf16", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ck.Config()
	ck.Close()
	if cfg.Dim != 128 || cfg.Layers != 2 || cfg.Vocab != 257 {
		t.Fatalf("config %+v", cfg)
	}
	if out, err := runCLI(t, "generate", "--checkpoint", dir, "--tokens", "72,105", "--max-tokens", "3", "--json"); err != nil || !strings.Contains(out, `"tokens"`) {
		t.Fatalf("generate on it: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "checkpoint", "init", "--shape", "nope", dir); err == nil || !strings.Contains(err.Error(), "tinyllama-1.1b") {
		t.Fatalf("unknown shape: %v", err)
	}
}
