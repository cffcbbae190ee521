package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExampleManifestsLoad(t *testing.T) {
	paths, _ := filepath.Glob("../../testnet/*.yaml")
	if len(paths) == 0 {
		t.Fatal("no example manifests in testnet/")
	}
	for _, p := range paths {
		if _, err := Load(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestDefaults(t *testing.T) {
	m, err := Parse([]byte("name: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Pipeline.Codec != "subspace" || m.Pipeline.Rank != 16 || m.Model.KVHeads != 4 || m.Data.Synthetic == nil {
		t.Fatalf("defaults: %+v", m)
	}
}

func TestBadFields(t *testing.T) {
	cases := []struct {
		yaml  string
		field string
		want  string
	}{
		{"model: {dim: 100, heads: 3}", "model.heads", "does not divide"},
		{"model: {dim: 48, heads: 16}", "model.heads", "even"},
		{"model: {heads: 4, kv_heads: 3}", "model.kv_heads", "must divide"},
		{"model: {layers: 2}\npipeline: {stages: 3}", "pipeline.stages", "at least one block"},
		{"pipeline: {codec: zip}", "pipeline.codec", "fp32, bf16, int8, subspace"},
		{"pipeline: {codec: fp32, rank: 8}", "pipeline.rank", "only used by the subspace codec"},
		{"train: {seq_len: 64, microbatches: 4, batch_tokens: 100}", "train.batch_tokens", "multiple"},
		{"train: {optimizer: {lr: -1}}", "train.optimizer.lr", "(0, 10]"},
		{"tokenizer: sentencepiece", "tokenizer", "byte, gpt2"},
		{"data: {text: a.txt, synthetic: {seed: 1}}", "data", "exactly one"},
		{"model: {checkpoint: ./ckpt, dim: 64}", "model", "not both"},
		{"model: {max_seq: 16}\ntrain: {seq_len: 64}", "model.max_seq", "at least train.seq_len"},
		{"name: 'has space'", "name", "letters"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.yaml))
		if err == nil {
			t.Errorf("%q accepted", tc.yaml)
			continue
		}
		if !HasField(err, tc.field) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: want field %s with %q, got %v", tc.yaml, tc.field, tc.want, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error spans lines: %q", tc.yaml, err)
		}
	}
}

func TestUnknownFieldNamed(t *testing.T) {
	_, err := Parse([]byte("pipeline:\n  stagez: 3\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "stagez" in pipeline`) || !strings.Contains(err.Error(), "stages") {
		t.Fatalf("got %v", err)
	}
	_, err = Parse([]byte("modle: {}\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "modle" in the manifest`) {
		t.Fatalf("got %v", err)
	}
}

func TestLoadLimits(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	os.WriteFile(big, []byte(strings.Repeat("#", MaxBytes+1)), 0o600)
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("got %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
	if _, err := Parse(nil); err == nil {
		t.Fatal("empty manifest accepted")
	}
}

func FuzzParse(f *testing.F) {
	b, _ := os.ReadFile("../../testnet/demo.yaml")
	f.Add(b)
	f.Add([]byte("model: {dim: 64}"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			return
		}
		if m.Validate() != nil {
			t.Fatal("Parse returned a manifest that does not validate")
		}
		if m.Train.BatchTokens%(m.Train.Microbatches*m.Train.SeqLen) != 0 {
			t.Fatal("accepted a batch that does not split into microbatches")
		}
	})
}
