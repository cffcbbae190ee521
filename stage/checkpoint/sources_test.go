package checkpoint_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
)

func initSources(cfg model.Config, seed uint64) []safetensors.Source {
	var out []safetensors.Source
	for _, t := range cfg.InitialTensors(model.Whole(cfg), seed) {
		read := t.Read
		out = append(out, safetensors.Source{Name: t.Name, Shape: t.Shape, Read: func(dst []float32) error { read(dst); return nil }})
	}
	return out
}

// A model written tensor by tensor from its initialisation, cut into
// shards with an index, loads back as exactly the model NewStage builds
// from the same seed; progress reaches the total.
func TestSaveSourcesShardsAndLoadsBack(t *testing.T) {
	cfg := model.Config{Vocab: 50, Dim: 16, Layers: 3, Heads: 4, KVHeads: 2, FFNDim: 32, MaxSeq: 16}
	dir := filepath.Join(t.TempDir(), "ck")
	var done, total int64
	err := checkpoint.SaveSources(dir, cfg, initSources(cfg, 42), nil, checkpoint.WithShardBytes(8<<10),
		checkpoint.WithProgress(func(d, tot int64) { done, total = d, tot }))
	if err != nil {
		t.Fatal(err)
	}
	if done != total || total != 4*cfg.ParamCount() {
		t.Fatalf("progress %d of %d, want %d", done, total, 4*cfg.ParamCount())
	}
	if _, err := os.Stat(filepath.Join(dir, checkpoint.ModelIndexFile)); err != nil {
		t.Fatalf("no index for a sharded model: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpoint.ModelFile)); err == nil {
		t.Fatal("a sharded model also wrote model.safetensors")
	}
	got, err := checkpoint.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, err := model.NewStage(cfg, model.Whole(cfg), model.WithSeed(42))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range want.Params() {
		q, ok := got.Stage.Param(p.Name)
		if !ok || !slices.Equal(p.Data(), q.Data()) {
			t.Fatalf("%s differs after a streamed save", p.Name)
		}
	}
	// Missing tensors are refused before anything is written.
	if err := checkpoint.SaveSources(filepath.Join(t.TempDir(), "x"), cfg, initSources(cfg, 1)[1:], nil); err == nil {
		t.Fatal("sources lacking a tensor were saved")
	}
}
