package checkpoint_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// small is a model with every Llama feature a checkpoint must carry:
// grouped-query attention, distinct norm gains, a context longer than the
// tests use.
func small() model.Config {
	return model.Config{
		Vocab: 61, Dim: 32, Layers: 3, Heads: 4, KVHeads: 2, FFNDim: 48, MaxSeq: 40,
		RopeTheta: 500, NormEps: 1e-5,
	}
}

func variants() map[string]model.Config {
	tied := small()
	tied.TieEmbeddings = true
	sub := small()
	sub.Subspace = model.SubspaceConfig{Rank: 8, Seed: 3}
	tail := sub
	tail.Subspace.DenseTail = 1
	mha := small()
	mha.KVHeads = 4
	return map[string]model.Config{"gqa": small(), "mha": mha, "tied": tied, "subspace": sub, "subspace-tail": tail}
}

func newModel(t *testing.T, cfg model.Config) *model.Model {
	t.Helper()
	m, err := model.New(cfg, model.WithSeed(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	modeltest.Perturb(t, modeltest.Weights{Stream: 9, Norm: 0.3, Matrix: 0.3}, m.Stage)
	return m
}

func save(t *testing.T, stages []*model.Stage, opts ...checkpoint.SaveOption) string {
	t.Helper()
	return checkpointtest.Save(t, filepath.Join(t.TempDir(), "ckpt"), stages, opts...)
}

var prompt = []int32{3, 17, 60, 0, 42, 42, 5, 11, 29}

// logits runs tokens through a whole model in one forward.
func logits(t *testing.T, s *model.Stage, toks []int32) []float32 {
	t.Helper()
	out, err := s.Forward(0, model.Input{Batch: 1, Seq: len(toks), Tokens: toks, NoGrad: true})
	if err != nil {
		t.Fatal(err)
	}
	return out.Logits
}

// decode runs a prefill of 4 tokens and then one token at a time through
// a chain of stages with KV caches, returning every position's logits.
func decode(t *testing.T, stages []*model.Stage, toks []int32) []float32 {
	t.Helper()
	caches := make([]*model.Cache, len(stages))
	for i, s := range stages {
		caches[i] = s.NewCache()
		defer caches[i].Free()
	}
	var all []float32
	for at := 0; at < len(toks); {
		n := 1
		if at == 0 {
			n = 4
		}
		in := model.Input{Batch: 1, Seq: n, Tokens: toks[at : at+n]}
		for i, s := range stages {
			out, err := s.Infer(caches[i], in)
			if err != nil {
				t.Fatal(err)
			}
			in.Hidden = out.Hidden
			all = append(all, out.Logits...)
		}
		at += n
	}
	return all
}

func TestStageTensorsMatchModelParams(t *testing.T) {
	for name, cfg := range variants() {
		spans3, _ := model.EvenSpans(cfg.Layers, 3)
		spans2, _ := model.EvenSpans(cfg.Layers, 2)
		for _, sp := range append(append([]model.Span{model.Whole(cfg)}, spans3...), spans2...) {
			st, err := model.NewStage(cfg, sp)
			if err != nil {
				t.Fatal(err)
			}
			refs := checkpoint.StageTensors(cfg, sp)
			params := st.Params()
			if len(refs) != len(params) {
				t.Fatalf("%s %+v: %d refs, %d params", name, sp, len(refs), len(params))
			}
			for i, p := range params {
				if refs[i].Name != p.Name || !slices.Equal(refs[i].Shape, p.Shape) {
					t.Errorf("%s %+v: ref %s%v, param %s%v", name, sp, refs[i].Name, refs[i].Shape, p.Name, p.Shape)
				}
				if strings.HasSuffix(p.Name, ".z") != (refs[i].File == checkpoint.FactorsFile) {
					t.Errorf("%s: %s assigned to %s", name, p.Name, refs[i].File)
				}
			}
			st.Close()
		}
	}
}

// TestRoundTripIsExact saves each variant in F32 and loads it whole and
// in stages: the logits, by full forward and by cached decoding, are
// bit-identical to the model that was saved.
func TestRoundTripIsExact(t *testing.T) {
	for name, cfg := range variants() {
		t.Run(name, func(t *testing.T) {
			m := newModel(t, cfg)
			dir := save(t, []*model.Stage{m.Stage}, checkpoint.WithTokenizer(tokenizer.Byte()))
			want := logits(t, m.Stage, prompt)
			wantDecode := decode(t, []*model.Stage{m.Stage}, prompt)

			ck, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if got := ck.TrainingConfig(); got.Subspace != cfg.Subspace || got.Vocab != cfg.Vocab || got.TieEmbeddings != cfg.TieEmbeddings {
				t.Errorf("TrainingConfig %+v, saved %+v", got, cfg)
			}
			if ck.Tokenizer() != "byte" {
				t.Errorf("tokenizer %q", ck.Tokenizer())
			}
			tc := ck.TrainingConfig()
			whole, err := ck.LoadStage(tc, model.Whole(tc))
			if err != nil {
				t.Fatal(err)
			}
			defer whole.Close()
			if got := logits(t, whole, prompt); !slices.Equal(got, want) {
				t.Errorf("loaded model's logits differ (max |Δ| %.3g)", maxDiff(got, want))
			}
			spans, _ := model.EvenSpans(tc.Layers, 2)
			stages, err := ck.LoadStages(tc, spans)
			if err != nil {
				t.Fatal(err)
			}
			if got := decode(t, stages, prompt); !slices.Equal(got, wantDecode) {
				t.Errorf("loaded stages' cached decoding differs (max |Δ| %.3g)", maxDiff(got, wantDecode))
			}
			for _, s := range stages {
				s.Close()
			}
			// The dense export computes the same function as the
			// constrained model (up to the rounding of U·Z).
			dc := ck.Config()
			if dc.Subspace.Enabled() {
				t.Fatal("Config() kept the constraint")
			}
			dense, err := ck.LoadStage(dc, model.Whole(dc))
			if err != nil {
				t.Fatal(err)
			}
			defer dense.Close()
			if d := maxDiff(logits(t, dense, prompt), want); d > 1e-4 {
				t.Errorf("dense load differs by %.3g", d)
			}
		})
	}
}

// TestBF16TiedCheckpointMatchesTransformers writes a tied-embedding GQA
// model the way a SmolLM2 checkpoint is stored (BF16, no lm_head.weight)
// and checks the loaded model (a) equals the in-memory model rounded to
// BF16, bit for bit, and (b) agrees with an independent float64 forward
// written from transformers' LlamaForCausalLM.
func TestBF16TiedCheckpointMatchesTransformers(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		t.Run(string(dt), func(t *testing.T) {
			cfg := small()
			cfg.TieEmbeddings = true
			m := newModel(t, cfg)
			dir := save(t, []*model.Stage{m.Stage}, checkpoint.WithDType(dt))

			f, err := safetensors.Open(filepath.Join(dir, checkpoint.ModelFile))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, ok := f.Info(model.NameHead); ok {
				t.Error("a tied checkpoint stores lm_head.weight")
			}
			for _, ti := range f.Tensors() {
				if ti.DType != dt {
					t.Errorf("%s stored as %s", ti.Name, ti.DType)
				}
			}
			hf, err := checkpoint.ReadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !hf.TieWordEmbeddings || hf.TorchDType != map[safetensors.DType]string{safetensors.BF16: "bfloat16", safetensors.F16: "float16"}[dt] {
				t.Errorf("config.json: tie %v, torch_dtype %q", hf.TieWordEmbeddings, hf.TorchDType)
			}

			// (a) Round the in-memory model to the stored precision.
			round := safetensors.Float32ToBF16
			widen := safetensors.BF16ToFloat32
			if dt == safetensors.F16 {
				round, widen = safetensors.Float32ToF16, safetensors.F16ToFloat32
			}
			for _, p := range m.Params() {
				data := p.Data()
				for i, v := range data {
					data[i] = widen(round(v))
				}
				if err := p.Set(data); err != nil {
					t.Fatal(err)
				}
			}
			loaded, err := checkpoint.LoadModel(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer loaded.Close()
			got := decode(t, []*model.Stage{loaded.Stage}, prompt)
			if want := decode(t, []*model.Stage{m.Stage}, prompt); !slices.Equal(got, want) {
				t.Errorf("loaded %s model differs from the rounded in-memory one (max |Δ| %.3g)", dt, maxDiff(got, want))
			}

			// (b) The independent transformers-convention forward.
			ref := hfForward(t, f, hf, prompt)
			if e := relErr(got, ref); e > 2e-5 {
				t.Errorf("logits differ from the transformers-convention reference by %.3g (relative)", e)
			}
		})
	}
}

// TestStageReadsOnlyItsTensors loads a middle stage through a ReaderAt
// that records every read: it reads the header and its own blocks'
// tensors, nothing else, and every byte of those once.
func TestStageReadsOnlyItsTensors(t *testing.T) {
	cfg := small()
	m := newModel(t, cfg)
	dir := save(t, []*model.Stage{m.Stage})
	raw, err := os.ReadFile(filepath.Join(dir, checkpoint.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	hf, err := checkpoint.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, span := range []model.Span{{First: 1, Last: 2}, {First: 0, Last: 1, Embed: true}, {First: 2, Last: 3, Head: true}} {
		rec := &recorder{r: bytes.NewReader(raw)}
		f, err := safetensors.OpenReader(rec, int64(len(raw)))
		if err != nil {
			t.Fatal(err)
		}
		ck, err := checkpoint.OpenFiles(hf, f, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := ck.LoadStage(cfg, span)
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
		hdrEnd := int64(8 + binary.LittleEndian.Uint64(raw[:8]))
		allowed := [][2]int64{{0, hdrEnd}}
		want := hdrEnd
		for _, ref := range checkpoint.StageTensors(cfg, span) {
			info, _ := f.Info(ref.Name)
			allowed = append(allowed, [2]int64{hdrEnd + info.Begin, hdrEnd + info.End})
			want += info.End - info.Begin
		}
		var total int64
		for _, r := range rec.reads {
			total += r[1] - r[0]
			if !slices.ContainsFunc(allowed, func(a [2]int64) bool { return r[0] >= a[0] && r[1] <= a[1] }) {
				t.Errorf("span %+v read bytes [%d,%d), outside its tensors", span, r[0], r[1])
			}
		}
		if total != want {
			t.Errorf("span %+v read %d bytes, its tensors and the header are %d (file %d)", span, total, want, len(raw))
		}
	}
}

type recorder struct {
	r     *bytes.Reader
	mu    sync.Mutex
	reads [][2]int64
}

func (c *recorder) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.mu.Lock()
	c.reads = append(c.reads, [2]int64{off, off + int64(n)})
	c.mu.Unlock()
	return n, err
}

// rewrite saves the model's dense tensors after edit, which may drop,
// reshape or alter them.
func rewrite(t *testing.T, dir string, edit func([]safetensors.Tensor) []safetensors.Tensor) {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(dir, checkpoint.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, info := range f.Tensors() {
		tt, err := f.ReadTensor(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tt)
	}
	f.Close()
	if err := safetensors.Write(filepath.Join(dir, checkpoint.ModelFile), edit(ts), nil); err != nil {
		t.Fatal(err)
	}
}

func TestBadCheckpointsNameTheTensor(t *testing.T) {
	cfg := small()
	m := newModel(t, cfg)
	const victim = "model.layers.1.mlp.up_proj.weight"
	cases := []struct {
		name     string
		edit     func(dir string)
		is       error
		mentions string
	}{
		{"missing", func(dir string) {
			rewrite(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Name == victim })
			})
		}, safetensors.ErrMissing, victim},
		{"misshaped", func(dir string) {
			rewrite(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
				for i := range ts {
					if ts[i].Name == victim {
						ts[i].Shape = []int{ts[i].Shape[1], ts[i].Shape[0]}
					}
				}
				return ts
			})
		}, safetensors.ErrShape, victim},
		{"untied without lm_head", func(dir string) {
			rewrite(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Name == model.NameHead })
			})
		}, safetensors.ErrMissing, model.NameHead},
		{"non-finite", func(dir string) {
			rewrite(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
				for i := range ts {
					if ts[i].Name == victim {
						ts[i].Data[7] = float32(math.Inf(-1))
					}
				}
				return ts
			})
		}, checkpoint.ErrTensor, victim},
		{"integer dtype", func(dir string) {
			writeRaw(t, filepath.Join(dir, checkpoint.ModelFile), `{"`+model.NameEmbed+`":{"dtype":"I32","shape":[61,32],"data_offsets":[0,7808]}}`, 7808)
		}, safetensors.ErrDType, model.NameEmbed},
		{"truncated", func(dir string) {
			p := filepath.Join(dir, checkpoint.ModelFile)
			raw, _ := os.ReadFile(p)
			os.WriteFile(p, raw[:len(raw)-100], 0o600)
		}, safetensors.ErrHeader, ""},
		{"hostile header length", func(dir string) {
			p := filepath.Join(dir, checkpoint.ModelFile)
			b := binary.LittleEndian.AppendUint64(nil, 1<<62)
			os.WriteFile(p, append(b, "{}"...), 0o600)
		}, safetensors.ErrHeader, ""},
		{"overlapping tensors", func(dir string) {
			writeRaw(t, filepath.Join(dir, checkpoint.ModelFile),
				`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, 24)
		}, safetensors.ErrHeader, ""},
		{"rope scaling", func(dir string) {
			editConfig(t, dir, `"rope_scaling": null`, `"rope_scaling": {"rope_type": "yarn", "factor": 8.0}`)
		}, checkpoint.ErrUnsupported, "rope_scaling"},
		{"not llama", func(dir string) {
			editConfig(t, dir, `"model_type": "llama"`, `"model_type": "gpt2"`)
			editConfig(t, dir, `"LlamaForCausalLM"`, `"GPT2LMHeadModel"`)
		}, checkpoint.ErrUnsupported, "gpt2"},
		{"head_dim", func(dir string) {
			editConfig(t, dir, `"head_dim": 8`, `"head_dim": 16`)
		}, checkpoint.ErrUnsupported, "head_dim"},
		{"config garbage", func(dir string) {
			os.WriteFile(filepath.Join(dir, checkpoint.ConfigFile), []byte(`{"vocab_size": 61,`), 0o600)
		}, checkpoint.ErrConfig, "config.json"},
		{"no config", func(dir string) {
			os.Remove(filepath.Join(dir, checkpoint.ConfigFile))
		}, checkpoint.ErrConfig, "config.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := save(t, []*model.Stage{m.Stage})
			c.edit(dir)
			loaded, err := checkpoint.LoadModel(dir)
			if err == nil {
				loaded.Close()
				t.Fatal("loaded")
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.mentions) {
				t.Errorf("error %q: want %v naming %q", err, c.is, c.mentions)
			}
		})
	}
	// A constrained load of a dense checkpoint says what is missing.
	dir := save(t, []*model.Stage{m.Stage})
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	sub := cfg
	sub.Subspace = model.SubspaceConfig{Rank: 4, Seed: 1}
	if _, err := ck.LoadStage(sub, model.Whole(sub)); !errors.Is(err, checkpoint.ErrTensor) || !strings.Contains(err.Error(), "model.embed_tokens.z") {
		t.Errorf("constrained load of a dense checkpoint: %v", err)
	}
}

func writeRaw(t *testing.T, path, header string, dataLen int) {
	t.Helper()
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	b = append(b, make([]byte, dataLen)...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func editConfig(t *testing.T, dir, old, repl string) {
	t.Helper()
	p := filepath.Join(dir, checkpoint.ConfigFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("config.json lacks %s:\n%s", old, b)
	}
	if err := os.WriteFile(p, bytes.Replace(b, []byte(old), []byte(repl), 1), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestResumeIsExact trains 3 steps, checkpoints with the optimizer state,
// loads the checkpoint into fresh stages and trains 3 more: the weights
// equal those of 6 uninterrupted steps bit for bit (constant learning
// rate, since the schedule restarts with a new trainer).
func TestResumeIsExact(t *testing.T) {
	for _, name := range []string{"gqa", "tied", "subspace"} {
		t.Run(name, func(t *testing.T) {
			cfg := variants()[name]
			tc := train.Config{Optim: optim.DefaultConfig(), Schedule: optim.Schedule{Peak: 1e-2, Min: 1e-2}, ClipNorm: 1}
			spans, _ := model.EvenSpans(cfg.Layers, 2)
			batches := func(step int) []model.Input {
				r := rand.New(rand.NewPCG(uint64(step), 5))
				in := model.Input{Batch: 2, Seq: 8, Tokens: make([]int32, 16), Targets: make([]int32, 16)}
				for i := range in.Tokens {
					in.Tokens[i], in.Targets[i] = int32(r.IntN(cfg.Vocab)), int32(r.IntN(cfg.Vocab))
				}
				return []model.Input{in}
			}
			run := func(tr *train.Trainer, from, to int) {
				for s := from; s < to; s++ {
					if _, err := tr.Step(context.Background(), batches(s)); err != nil {
						t.Fatal(err)
					}
				}
			}
			ref, err := model.NewStages(cfg, spans, model.WithSeed(2))
			if err != nil {
				t.Fatal(err)
			}
			refTr, _ := train.New(ref, tc)
			run(refTr, 0, 6)

			first, _ := model.NewStages(cfg, spans, model.WithSeed(2))
			tr, _ := train.New(first, tc)
			run(tr, 0, 3)
			snap, err := checkpoint.Capture(first, tr.Optimizers())
			if err != nil {
				t.Fatal(err)
			}
			snap.State = &checkpoint.TrainState{Step: 3, Tokens: 48}
			dir := filepath.Join(t.TempDir(), "ck")
			if err := checkpoint.Save(dir, snap); err != nil {
				t.Fatal(err)
			}
			ck, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			resumed, err := ck.LoadStages(ck.TrainingConfig(), spans)
			if err != nil {
				t.Fatal(err)
			}
			tr2, _ := train.New(resumed, tc)
			for i, s := range resumed {
				if err := ck.LoadOptimizer(s, tr2.Optimizers()[i]); err != nil {
					t.Fatal(err)
				}
				if tr2.Optimizers()[i].Steps() != 3 {
					t.Errorf("optimizer steps %d after resume", tr2.Optimizers()[i].Steps())
				}
			}
			run(tr2, 3, 6)
			for i := range ref {
				for _, p := range ref[i].Params() {
					q, _ := resumed[i].Param(p.Name)
					if !slices.Equal(p.Data(), q.Data()) {
						t.Errorf("%s differs after resuming (max |Δ| %.3g)", p.Name, maxDiff(p.Data(), q.Data()))
					}
				}
			}
		})
	}
}

func TestSaveReplacesAtomicallyAndOnlyCheckpoints(t *testing.T) {
	m := newModel(t, small())
	snap, err := checkpoint.Capture([]*model.Stage{m.Stage}, nil)
	if err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	dir := filepath.Join(parent, "out")
	snap.State = &checkpoint.TrainState{Step: 1}
	if err := checkpoint.Save(dir, snap); err != nil {
		t.Fatal(err)
	}
	snap.State = &checkpoint.TrainState{Step: 2}
	if err := checkpoint.Save(dir, snap, checkpoint.WithDType(safetensors.BF16)); err != nil {
		t.Fatal(err)
	}
	if st, err := checkpoint.ReadState(dir); err != nil || st.Step != 2 {
		t.Errorf("state after replace: %+v, %v", st, err)
	}
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 || entries[0].Name() != "out" {
		t.Errorf("parent holds %v, want only out", entries)
	}
	// A directory with other files is not a checkpoint: never replaced.
	other := filepath.Join(parent, "home")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o600)
	if err := checkpoint.Save(other, snap); err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("saving over a foreign directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "notes.txt")); string(b) != "mine" {
		t.Error("foreign file lost")
	}
	// A snapshot missing a tensor is refused before anything is written.
	bad := snap
	bad.Dense = bad.Dense[1:]
	if err := checkpoint.Save(filepath.Join(parent, "bad"), bad); err == nil {
		t.Error("saved a snapshot without the embedding")
	}
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

func relErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range got {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / max(den, 1e-300))
}

// TestShardedCheckpoint splits model.safetensors into two shards with an
// index, as transformers does for large models: it loads to the same
// logits; an index pointing outside the directory is refused.
func TestShardedCheckpoint(t *testing.T) {
	m := newModel(t, small())
	dir := save(t, []*model.Stage{m.Stage})
	f, err := safetensors.Open(filepath.Join(dir, checkpoint.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	var parts [2][]safetensors.Tensor
	weightMap := map[string]string{}
	for i, info := range f.Tensors() {
		x, err := f.ReadTensor(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		parts[i%2] = append(parts[i%2], x)
		weightMap[info.Name] = fmt.Sprintf("model-%05d-of-00002.safetensors", i%2+1)
	}
	f.Close()
	os.Remove(filepath.Join(dir, checkpoint.ModelFile))
	for i, p := range parts {
		if err := safetensors.Write(filepath.Join(dir, fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)), p, nil); err != nil {
			t.Fatal(err)
		}
	}
	writeIndex := func(wm map[string]string) {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]int{"total_size": 1}, "weight_map": wm})
		if err := os.WriteFile(filepath.Join(dir, checkpoint.ModelIndexFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeIndex(weightMap)
	loaded, err := checkpoint.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	if got, want := logits(t, loaded.Stage, prompt), logits(t, m.Stage, prompt); !slices.Equal(got, want) {
		t.Errorf("sharded load differs by %.3g", maxDiff(got, want))
	}
	weightMap[model.NameFinalNorm] = "../" + weightMap[model.NameFinalNorm]
	writeIndex(weightMap)
	if _, err := checkpoint.LoadModel(dir); !errors.Is(err, checkpoint.ErrConfig) || !strings.Contains(err.Error(), model.NameFinalNorm) {
		t.Errorf("index pointing outside the directory: %v", err)
	}
}

// TestLlama3RopeScalingMatchesTransformers round-trips a Llama 3.1-style
// rope_scaling through config.json and checks the loaded model against
// the transformers-convention reference; the test model's frequencies
// span all three of llama3's regimes (kept, smoothed, divided).
func TestLlama3RopeScalingMatchesTransformers(t *testing.T) {
	cfg := small()
	cfg.Heads, cfg.KVHeads = 4, 2 // head dim 8: wavelengths 6, 30, 140, 660
	cfg.RopeScaling = model.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
	m := newModel(t, cfg)
	dir := save(t, []*model.Stage{m.Stage})
	hf, err := checkpoint.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := hf.Model(); got.RopeScaling != cfg.RopeScaling {
		t.Fatalf("rope_scaling came back as %+v", got.RopeScaling)
	}
	loaded, err := checkpoint.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	f, err := safetensors.Open(filepath.Join(dir, checkpoint.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := decode(t, []*model.Stage{loaded.Stage}, prompt)
	if e := relErr(got, hfForward(t, f, hf, prompt)); e > 2e-5 {
		t.Errorf("llama3-scaled logits differ from the reference by %.3g", e)
	}
	plain := hf
	plain.RopeScaling = nil
	if e := relErr(got, hfForward(t, f, plain, prompt)); e < 1e-3 {
		t.Errorf("the scaling changes nothing (%.3g): the test cannot tell", e)
	}
}

// TestLoadReportsProgress: OnLoad sees the bytes of a stage's tensors grow
// to their total, once per tensor; a bf16 checkpoint's total is 2 bytes a
// value, and its serving stage keeps them so.
func TestLoadReportsProgress(t *testing.T) {
	m := newModel(t, small())
	dir := checkpointtest.Save(t, filepath.Join(t.TempDir(), "ck"), []*model.Stage{m.Stage}, checkpoint.WithDType(safetensors.BF16))
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var calls int
	var last, total int64
	ck.OnLoad = func(d, tot int64) { calls, last, total = calls+1, d, tot }
	cfg := ck.Config()
	st, err := ck.LoadStage(cfg, model.Whole(cfg), model.WithoutGrad())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var values int64
	for _, p := range st.Params() {
		values += int64(p.Len())
	}
	if calls != len(st.Params()) || last != total || total != 2*values {
		t.Fatalf("%d calls for %d tensors, ended at %d of %d bytes (%d values)", calls, len(st.Params()), last, total, values)
	}
	if st.WeightDType() != tensor.BFloat16 {
		t.Fatalf("a bf16 checkpoint serves as %v", st.WeightDType())
	}
}
