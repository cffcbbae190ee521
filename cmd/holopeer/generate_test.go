package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// testCheckpoint writes a random model over the byte vocabulary with
// weights of order one (so the next token is never a near tie), the way
// a SmolLM2 checkpoint is stored: BF16, tied embeddings.
func testCheckpoint(t *testing.T) (string, model.Config) {
	t.Helper()
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 48, TieEmbeddings: true}
	m, err := model.New(cfg, model.WithSeed(9))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	modeltest.Perturb(t, modeltest.Weights{Stream: 1, Norm: 0.2, Matrix: 0.5}, m.Stage)
	dir := checkpointtest.Save(t, filepath.Join(t.TempDir(), "ck"), []*model.Stage{m.Stage},
		checkpoint.WithDType(safetensors.BF16), checkpoint.WithTokenizer(tokenizer.Byte()))
	return dir, cfg
}

type genOutput struct {
	Tokens []int   `json:"tokens"`
	Text   *string `json:"text"`
}

func generateJSON(t *testing.T, args ...string) genOutput {
	t.Helper()
	stdout, err := runCLI(t, append([]string{"generate", "--json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var g genOutput
	if err := json.Unmarshal([]byte(stdout), &g); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	return g
}

// TestGenerateGreedyMatchesRecomputation checks greedy KV-cached decoding
// from the BF16 checkpoint against an argmax over a full forward of the
// whole sequence for every new token, on the loaded model.
func TestGenerateGreedyMatchesRecomputation(t *testing.T) {
	dir, cfg := testCheckpoint(t)
	prompt := []int32{104, 111, 108, 97}
	g := generateJSON(t, "--checkpoint", dir, "--tokens", "104,111,108,97", "--max-tokens", "20")

	m, err := checkpoint.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq := slices.Clone(prompt)
	var want []int
	for len(want) < 20 {
		out, err := m.Forward(0, model.Input{Batch: 1, Seq: len(seq), Tokens: seq, NoGrad: true})
		if err != nil {
			t.Fatal(err)
		}
		last := out.Logits[(len(seq)-1)*cfg.Vocab:]
		next := 0
		for i, l := range last {
			if l > last[next] {
				next = i
			}
		}
		want = append(want, next)
		if next == tokenizer.ByteEOS {
			break
		}
		seq = append(seq, int32(next))
	}
	if !slices.Equal(g.Tokens, want) {
		t.Errorf("generated %v\nrecomputed %v", g.Tokens, want)
	}
	// JSON carries the text as UTF-8: invalid bytes become U+FFFD.
	var text string
	b, _ := json.Marshal(tokenizer.Byte().Decode(withoutEOS(want, []int{tokenizer.ByteEOS})))
	json.Unmarshal(b, &text)
	if g.Text == nil || *g.Text != text {
		t.Errorf("text %q for tokens %v, want %q", deref(g.Text), g.Tokens, text)
	}
	// --prompt encodes with the checkpoint's tokenizer (no BOS for bytes).
	if p := generateJSON(t, "--checkpoint", dir, "--prompt", "hola", "--max-tokens", "20"); !slices.Equal(p.Tokens, want) {
		t.Errorf("--prompt gave %v, --tokens %v", p.Tokens, want)
	}
}

func TestGenerateSamplingIsSeeded(t *testing.T) {
	dir, _ := testCheckpoint(t)
	args := []string{"--checkpoint", dir, "--prompt", "x", "--max-tokens", "30", "--temperature", "1.5", "--top-p", "0.95"}
	a := generateJSON(t, append(args, "--seed", "11")...)
	b := generateJSON(t, append(args, "--seed", "11")...)
	c := generateJSON(t, append(args, "--seed", "12")...)
	if !slices.Equal(a.Tokens, b.Tokens) {
		t.Errorf("same seed, different tokens: %v vs %v", a.Tokens, b.Tokens)
	}
	if slices.Equal(a.Tokens, c.Tokens) {
		t.Errorf("seeds 11 and 12 sampled the same %d tokens", len(a.Tokens))
	}
	// Plain output streams the text.
	stdout, err := runCLI(t, append([]string{"generate"}, append(args, "--seed", "11")...)...)
	if err != nil {
		t.Fatal(err)
	}
	if want := tokenizer.Byte().Decode(withoutEOS(a.Tokens, []int{tokenizer.ByteEOS})) + "\n"; stdout != want {
		t.Errorf("text output %q, want %q", stdout, want)
	}
}

func TestGenerateStopsAtEOSAndContext(t *testing.T) {
	dir, cfg := testCheckpoint(t)
	m, err := checkpoint.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt := []int32{1, 2, 3}
	all, err := generate(m.Stage, prompt, genConfig{maxTokens: 10}, nil)
	if err != nil || len(all) != 10 {
		t.Fatalf("%v, %v", all, err)
	}
	// Declaring the fourth token an end of sequence stops there (or at
	// its first earlier occurrence).
	stop := all[3]
	got, err := generate(m.Stage, prompt, genConfig{maxTokens: 10, eos: []int{stop}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := all[:slices.Index(all, stop)+1]
	if !slices.Equal(got, want) {
		t.Errorf("with EOS %d: %v, want %v", stop, got, want)
	}
	// A full context ends generation without an error.
	got, err = generate(m.Stage, prompt, genConfig{maxTokens: 1000}, nil)
	if err != nil || len(prompt)+len(got) != cfg.MaxSeq+1 {
		t.Errorf("%d tokens after a %d-token prompt with context %d: %v", len(got), len(prompt), cfg.MaxSeq, err)
	}
}

func TestGenerateErrors(t *testing.T) {
	dir, cfg := testCheckpoint(t)
	long := strings.Repeat("1,", cfg.MaxSeq) + "1"
	broken := filepath.Join(t.TempDir(), "broken")
	os.CopyFS(broken, os.DirFS(dir))
	raw, _ := os.ReadFile(filepath.Join(broken, checkpoint.ModelFile))
	os.WriteFile(filepath.Join(broken, checkpoint.ModelFile), raw[:len(raw)/2], 0o600)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--checkpoint", dir, "--max-tokens", "3"}, "exactly one of --prompt or --tokens"},
		{[]string{"--checkpoint", dir, "--prompt", "a", "--tokens", "1", "--max-tokens", "3"}, "exactly one"},
		{[]string{"--checkpoint", dir, "--prompt", "a"}, "--max-tokens"},
		{[]string{"--prompt", "a", "--max-tokens", "3"}, "--checkpoint is required"},
		{[]string{"--checkpoint", dir, "--tokens", "1,257", "--max-tokens", "3"}, "id 257 outside"},
		{[]string{"--checkpoint", dir, "--tokens", "1,x", "--max-tokens", "3"}, `"x" is not a token id`},
		{[]string{"--checkpoint", dir, "--tokens", long, "--max-tokens", "3"}, "context is 48"},
		{[]string{"--checkpoint", dir, "--tokens", "1", "--max-tokens", "3", "--temperature", "-1"}, "--temperature"},
		{[]string{"--checkpoint", dir, "--tokens", "1", "--max-tokens", "3", "--top-p", "0"}, "--top-p"},
		{[]string{"--checkpoint", filepath.Join(dir, "nope"), "--tokens", "1", "--max-tokens", "3"}, "config.json"},
		{[]string{"--checkpoint", broken, "--tokens", "1", "--max-tokens", "3"}, "truncated"},
	}
	for _, c := range cases {
		if _, err := runCLI(t, append([]string{"generate"}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error mentioning %q", c.args, err, c.want)
		}
	}
}

// TestTrainThenGenerate generates from what train --local wrote.
func TestTrainThenGenerate(t *testing.T) {
	job := writeJob(t, "subspace")
	out := filepath.Join(t.TempDir(), "run")
	if _, err := runCLI(t, "train", "--local", job, "--out", out, "--steps", "8", "--json"); err != nil {
		t.Fatal(err)
	}
	g := generateJSON(t, "--checkpoint", filepath.Join(out, runCheckpointDir), "--prompt", "the ", "--max-tokens", "10", "--temperature", "0.7", "--seed", "1")
	if len(g.Tokens) == 0 || len(g.Tokens) > 10 || g.Text == nil {
		t.Fatalf("generated %+v", g)
	}
	for _, id := range g.Tokens {
		if id < 0 || id > tokenizer.ByteEOS {
			t.Errorf("token %s outside the byte vocabulary", strconv.Itoa(id))
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
