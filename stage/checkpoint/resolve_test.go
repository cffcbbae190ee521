package checkpoint_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

func parseManifest(t *testing.T, dir, text string) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	m.SetDir(dir)
	return m
}

func TestResolveDemoManifest(t *testing.T) {
	m, err := manifest.Load("../../testnet/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := checkpoint.ResolveModel(m, tokenizer.Byte())
	if err != nil {
		t.Fatal(err)
	}
	want := model.Config{Vocab: 257, Dim: 128, Layers: 6, Heads: 4, KVHeads: 2, FFNDim: 344, MaxSeq: 512,
		RopeTheta: 10000, NormEps: 1e-5, Subspace: model.SubspaceConfig{Rank: 32, Seed: 7}}
	if cfg != want {
		t.Errorf("resolved %+v\nwant     %+v", cfg, want)
	}
	tc, err := checkpoint.TrainConfig(m)
	if err != nil {
		t.Fatal(err)
	}
	if tc.Schedule != (optim.Schedule{Peak: 0.003, Min: 0.0003, Warmup: 10, Total: 120}) || tc.ClipNorm != 1 ||
		tc.Optim != (optim.Config{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}) {
		t.Errorf("train config %+v", tc)
	}
}

func TestResolveFromCheckpoint(t *testing.T) {
	dir := t.TempDir()
	cfg := small()
	cfg.TieEmbeddings = true
	m := newModel(t, cfg)
	checkpointtest.Save(t, filepath.Join(dir, "base"), []*model.Stage{m.Stage})
	const job = "model:\n  checkpoint: base\ntrain:\n  seq_len: 16\npipeline:\n  codec: %s\n"
	// Dense fine-tuning takes the architecture from config.json.
	mf := parseManifest(t, dir, strings.Replace(job, "%s", "bf16", 1))
	got, err := checkpoint.ResolveModel(mf, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Dim != cfg.Dim || got.Layers != cfg.Layers || !got.TieEmbeddings || got.RopeTheta != cfg.RopeTheta || got.Vocab != cfg.Vocab {
		t.Errorf("resolved %+v from a checkpoint of %+v", got, cfg)
	}
	// A tokenizer with more ids than the embedding has rows is refused.
	if _, err := checkpoint.ResolveModel(mf, tokenizer.Byte()); !errors.Is(err, checkpoint.ErrConfig) {
		t.Errorf("byte tokenizer (257 ids) on a 61-row embedding: %v", err)
	}
	// The subspace codec cannot start from a dense checkpoint.
	ms := parseManifest(t, dir, strings.Replace(job, "%s", "subspace", 1)+"  rank: 8\n")
	if _, err := checkpoint.ResolveModel(ms, nil); !errors.Is(err, checkpoint.ErrConfig) || !strings.Contains(err.Error(), "dense") {
		t.Errorf("subspace from a dense checkpoint: %v", err)
	}
	// A missing checkpoint names the field.
	os.RemoveAll(filepath.Join(dir, "base"))
	if _, err := checkpoint.ResolveModel(mf, nil); err == nil || !strings.Contains(err.Error(), "model.checkpoint") {
		t.Errorf("missing checkpoint: %v", err)
	}
}

func TestResolveDefaultsVocabAndSubspace(t *testing.T) {
	m := parseManifest(t, t.TempDir(), "model:\n  dim: 64\n  layers: 3\n  heads: 4\ntrain:\n  seq_len: 32\n  steps: 10\npipeline:\n  codec: fp32\n")
	cfg, err := checkpoint.ResolveModel(m, tokenizer.Byte())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Vocab != 257 || cfg.KVHeads != 4 || cfg.Subspace.Enabled() || cfg.MaxSeq != 32 {
		t.Errorf("resolved %+v", cfg)
	}
	m = parseManifest(t, t.TempDir(), "model:\n  dim: 64\n  layers: 3\n  heads: 4\n  vocab: 100\n")
	if _, err := checkpoint.ResolveModel(m, tokenizer.Byte()); !errors.Is(err, checkpoint.ErrConfig) {
		t.Errorf("vocab smaller than the tokenizer's: %v", err)
	}
}
