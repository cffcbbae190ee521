package model_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/optim"
	tt "github.com/holopeer/holopeer/stage/tensor/tensortest"
)

// tiny returns a small model config with every optional field explicit.
func tiny(layers int) model.Config {
	return model.Config{
		Vocab: 13, Dim: 8, Layers: layers, Heads: 2, KVHeads: 1, FFNDim: 12, MaxSeq: 16,
		RopeTheta: 10000, NormEps: 1e-5, InitStd: 0.02,
	}
}

func variants(layers int) map[string]model.Config {
	dense := tiny(layers)
	mha := tiny(layers)
	mha.KVHeads = 2
	tied := tiny(layers)
	tied.TieEmbeddings = true
	sub := tiny(layers)
	sub.Subspace = model.SubspaceConfig{Rank: 3, Seed: 5}
	subTail := sub
	subTail.Subspace.DenseTail = 1
	return map[string]model.Config{"gqa": dense, "mha": mha, "tied": tied, "subspace": sub, "subspace-dense-tail": subTail}
}

// perturbed is how the tests set a model's weights to order one.
var perturbed = modeltest.Weights{Stream: 77, Norm: 0.2, Matrix: 0.4}

// batch returns two microbatches of different shapes, with ignored targets
// and explicit positions in the second, and their total target count.
func batch(cfg model.Config, seed uint64) ([]model.Input, int) {
	r := rand.New(rand.NewPCG(seed, 1))
	mk := func(b, s int) model.Input {
		in := model.Input{Batch: b, Seq: s, Tokens: make([]int32, b*s), Targets: make([]int32, b*s)}
		for i := range in.Tokens {
			in.Tokens[i] = int32(r.IntN(cfg.Vocab))
			in.Targets[i] = int32(r.IntN(cfg.Vocab))
		}
		return in
	}
	a, b := mk(2, 5), mk(1, 4)
	b.Targets[0], b.Targets[2] = -100, -1
	b.Positions = []int32{3, 4, 5, 6}
	return []model.Input{a, b}, 10 + 2
}

// TestGradientsMatchFiniteDifferences checks every gradient of a whole
// small model, accumulated over two microbatches, against central
// differences of the float64 reference model, and the forward loss
// against the reference's.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	for name, cfg := range variants(2) {
		t.Run(name, func(t *testing.T) {
			m, err := model.New(cfg, model.WithSeed(3))
			if err != nil {
				t.Fatal(err)
			}
			modeltest.Perturb(t, perturbed, m.Stage)
			mbs, total := batch(cfg, 1)
			var loss float64
			for i, mb := range mbs {
				mb.LossTokens = total
				out, err := m.Forward(i, mb)
				if err != nil {
					t.Fatal(err)
				}
				loss += out.Loss
				if _, err := m.Backward(i, nil); err != nil {
					t.Fatal(err)
				}
			}
			ref := newRef(m.Config(), m.Tensors(), m.Basis())
			want := ref.loss(mbs, total)
			if e := math.Abs(loss-want) / want; e > 1e-6 {
				t.Errorf("loss %.9g, float64 reference %.9g (rel %.2g)", loss, want, e)
			}
			worst, worstName := 0.0, ""
			for _, p := range m.Params() {
				orig := ref.p[p.Name]
				fd := tt.NumGrad(func(x []float64) float64 {
					ref.p[p.Name] = x
					return ref.loss(mbs, total)
				}, orig, 1e-5)
				ref.p[p.Name] = orig
				e := tt.RelErr(p.GradData(), fd)
				if e > worst {
					worst, worstName = e, p.Name
				}
				if e > 1e-4 {
					t.Errorf("%s: gradient differs from central differences by %.3g (relative to its largest element)", p.Name, e)
				}
			}
			t.Logf("loss %.6f; %d tensors, worst gradient rel err %.2e (%s)", loss, len(m.Params()), worst, worstName)
		})
	}
}

func trainConfig() train.Config {
	return train.Config{
		Optim:    optim.Config{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1},
		Schedule: optim.Schedule{Peak: 3e-2, Min: 3e-3, Warmup: 1, Total: 4},
		ClipNorm: 0.5,
	}
}

// run trains cfg cut into n stages for steps steps and returns the losses
// and the final parameters by name.
func run(t *testing.T, cfg model.Config, n, steps int, seed uint64) ([]train.Result, map[string][]float32) {
	t.Helper()
	spans, err := model.EvenSpans(cfg.Layers, n)
	if err != nil {
		t.Fatal(err)
	}
	stages, err := model.NewStages(cfg, spans, model.WithSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := train.New(stages, trainConfig())
	if err != nil {
		t.Fatal(err)
	}
	var results []train.Result
	for step := 0; step < steps; step++ {
		mbs, _ := batch(cfg, uint64(step+10))
		res, err := tr.Step(context.Background(), mbs)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	params := map[string][]float32{}
	for _, s := range stages {
		for _, p := range s.Params() {
			if prev, ok := params[p.Name]; ok && !slices.Equal(prev, p.Data()) {
				t.Fatalf("tied copies of %s diverged", p.Name)
			}
			params[p.Name] = p.Data()
		}
	}
	return results, params
}

// TestSplitsTrainIdentically cuts a model into 1, 2 and 4 stages and checks
// that losses, gradient norms and parameter updates agree with the uncut
// model.
func TestSplitsTrainIdentically(t *testing.T) {
	for name, cfg := range variants(4) {
		t.Run(name, func(t *testing.T) {
			want, wantParams := run(t, cfg, 1, 3, 21)
			for _, n := range []int{2, 4} {
				got, gotParams := run(t, cfg, n, 3, 21)
				for i := range want {
					if e := math.Abs(got[i].Loss-want[i].Loss) / want[i].Loss; e > 1e-6 {
						t.Errorf("%d stages, step %d: loss %.9g, uncut %.9g", n, i, got[i].Loss, want[i].Loss)
					}
					if e := math.Abs(got[i].GradNorm-want[i].GradNorm) / want[i].GradNorm; e > 1e-5 {
						t.Errorf("%d stages, step %d: grad norm %.9g, uncut %.9g", n, i, got[i].GradNorm, want[i].GradNorm)
					}
				}
				if len(gotParams) != len(wantParams) {
					t.Fatalf("%d stages hold %d tensors, uncut %d", n, len(gotParams), len(wantParams))
				}
				worst := 0.0
				for name, w := range wantParams {
					worst = math.Max(worst, tt.RelErr(gotParams[name], tt.F64(w)))
				}
				// Untied splits run the very same ops and agree bit for bit.
				// A tied weight's two gradients are summed in another order
				// (per microbatch uncut, at the end by TieGrads), which
				// Adam's m/√v amplifies for near-zero gradient elements.
				tol := 1e-6
				if cfg.TieEmbeddings {
					tol = 2e-5
				}
				if worst > tol {
					t.Errorf("%d stages: parameters differ from the uncut model's by %.3g", n, worst)
				}
				t.Logf("%d stages: final loss %.6f (uncut %.6f), worst parameter rel diff %.2e",
					n, got[len(got)-1].Loss, want[len(want)-1].Loss, worst)
			}
		})
	}
}

// TestMicrobatchingMatchesOneBatch: the same sequences as one microbatch
// or as several give the same loss and gradients.
func TestMicrobatchingMatchesOneBatch(t *testing.T) {
	cfg := tiny(2)
	whole := func(split bool) (float64, map[string][]float32) {
		m, err := model.New(cfg, model.WithSeed(4))
		if err != nil {
			t.Fatal(err)
		}
		modeltest.Perturb(t, perturbed, m.Stage)
		r := rand.New(rand.NewPCG(8, 8))
		in := model.Input{Batch: 3, Seq: 6, Tokens: make([]int32, 18), Targets: make([]int32, 18)}
		for i := range in.Tokens {
			in.Tokens[i], in.Targets[i] = int32(r.IntN(cfg.Vocab)), int32(r.IntN(cfg.Vocab))
		}
		mbs := []model.Input{in}
		if split {
			mbs = nil
			for b := 0; b < 3; b++ {
				mbs = append(mbs, model.Input{Batch: 1, Seq: 6, Tokens: in.Tokens[b*6 : b*6+6], Targets: in.Targets[b*6 : b*6+6], LossTokens: 18})
			}
		}
		var loss float64
		for i, mb := range mbs {
			out, err := m.Forward(i, mb)
			if err != nil {
				t.Fatal(err)
			}
			loss += out.Loss
		}
		for i := range mbs { // all forwards first, as a pipeline's warm-up does
			if _, err := m.Backward(i, nil); err != nil {
				t.Fatal(err)
			}
		}
		grads := map[string][]float32{}
		for _, p := range m.Params() {
			grads[p.Name] = p.GradData()
		}
		return loss, grads
	}
	l1, g1 := whole(false)
	l3, g3 := whole(true)
	if math.Abs(l1-l3) > 1e-6*l1 {
		t.Errorf("loss %.9g as one batch, %.9g as three microbatches", l1, l3)
	}
	for name, g := range g1 {
		if e := tt.RelErr(g3[name], tt.F64(g)); e > 1e-5 {
			t.Errorf("%s: gradients differ by %.3g", name, e)
		}
	}
}

// TestSubspaceInvariantHoldsWhileTraining trains a constrained model cut
// into 4 stages and checks h − E_fix[token] stays in span(U) at every
// boundary; a boundary after a dense block must show the violation.
func TestSubspaceInvariantHoldsWhileTraining(t *testing.T) {
	cfg := model.Config{Vocab: 50, Dim: 32, Layers: 4, Heads: 4, KVHeads: 2, FFNDim: 48, MaxSeq: 32,
		Subspace: model.SubspaceConfig{Rank: 4, Seed: 11}}
	spans, _ := model.EvenSpans(4, 4)
	stages, err := model.NewStages(cfg, spans, model.WithSeed(2))
	if err != nil {
		t.Fatal(err)
	}
	tc := trainConfig()
	tc.Schedule = optim.Schedule{Peak: 1e-2, Min: 1e-3, Warmup: 2, Total: 8}
	tr, err := train.New(stages, tc)
	if err != nil {
		t.Fatal(err)
	}
	var first, last train.Result
	for step := 0; step < 8; step++ {
		mbs, _ := batch(cfg, uint64(step))
		res, err := tr.Step(context.Background(), mbs)
		if err != nil {
			t.Fatal(err)
		}
		for b, r := range res.Residuals {
			if r < 0 || r > 1e-5 {
				t.Errorf("step %d, boundary after stage %d: residual %.3g", step, b, r)
			}
		}
		if step == 0 {
			first = res
		}
		last = res
	}
	t.Logf("residuals after 8 steps: %.2e (loss %.4f → %.4f)", last.Residuals, first.Loss, last.Loss)
	if !(last.Loss < first.Loss) {
		t.Errorf("loss did not fall: %.4f → %.4f", first.Loss, last.Loss)
	}

	// With the last two blocks dense, only the boundary before them holds.
	cfg.Subspace.DenseTail = 2
	spans, _ = model.SpansAt(4, []int{2, 3})
	stages, err = model.NewStages(cfg, spans, model.WithSeed(2))
	if err != nil {
		t.Fatal(err)
	}
	mbs, _ := batch(cfg, 1)
	in := model.Input{Batch: mbs[0].Batch, Seq: mbs[0].Seq, Tokens: mbs[0].Tokens, NoGrad: true}
	out0, err := stages[0].Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	in.Hidden = out0.Hidden
	out1, err := stages[1].Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	if out0.SubspaceResidual > 1e-5 || out1.SubspaceResidual < 1e-3 {
		t.Errorf("residuals %.3g (constrained blocks) and %.3g (after a dense block)", out0.SubspaceResidual, out1.SubspaceResidual)
	}
}

// TestDeterministicUnderSeed: equal seeds give bit-identical runs,
// different seeds different models.
func TestDeterministicUnderSeed(t *testing.T) {
	cfg := variants(2)["subspace"]
	r1, p1 := run(t, cfg, 2, 2, 5)
	r2, p2 := run(t, cfg, 2, 2, 5)
	for i := range r1 {
		if r1[i].Loss != r2[i].Loss || r1[i].GradNorm != r2[i].GradNorm {
			t.Fatalf("step %d: %+v vs %+v", i, r1[i], r2[i])
		}
	}
	for name, p := range p1 {
		if !slices.Equal(p, p2[name]) {
			t.Fatalf("%s differs between identical runs", name)
		}
	}
	_, p3 := run(t, cfg, 2, 0, 6)
	_, p4 := run(t, cfg, 2, 0, 5)
	if slices.Equal(p3["model.layers.0.self_attn.q_proj.weight"], p4["model.layers.0.self_attn.q_proj.weight"]) {
		t.Fatal("different seeds gave the same initialisation")
	}
}

// TestKVCacheMatchesFullForward decodes with a KV cache, stage by stage,
// and compares every step's logits with a forward over the whole sequence.
func TestKVCacheMatchesFullForward(t *testing.T) {
	for _, name := range []string{"gqa", "subspace", "tied"} {
		cfg := variants(4)[name]
		t.Run(name, func(t *testing.T) {
			toks := []int32{1, 7, 3, 3, 12, 0, 5, 9, 2}
			whole, err := model.New(cfg, model.WithSeed(8))
			if err != nil {
				t.Fatal(err)
			}
			modeltest.Perturb(t, perturbed, whole.Stage)
			full, err := whole.Forward(0, model.Input{Batch: 1, Seq: len(toks), Tokens: toks, NoGrad: true})
			if err != nil {
				t.Fatal(err)
			}
			spans, _ := model.EvenSpans(cfg.Layers, 2)
			stages, err := model.NewStages(cfg, spans, model.WithSeed(8))
			if err != nil {
				t.Fatal(err)
			}
			modeltest.Perturb(t, perturbed, stages...)
			caches := []*model.Cache{stages[0].NewCache(), stages[1].NewCache()}
			v := cfg.Vocab
			for at := 0; at < len(toks); {
				step := 1
				if at == 0 {
					step = 4 // prefill
				}
				in := model.Input{Batch: 1, Seq: step, Tokens: toks[at : at+step]}
				mid, err := stages[0].Infer(caches[0], in)
				if err != nil {
					t.Fatal(err)
				}
				in.Hidden = mid.Hidden
				out, err := stages[1].Infer(caches[1], in)
				if err != nil {
					t.Fatal(err)
				}
				if e := tt.RelErr(out.Logits, tt.F64(full.Logits[at*v:(at+step)*v])); e > 1e-5 {
					t.Errorf("tokens %d..%d: cached logits differ by %.3g", at, at+step, e)
				}
				at += step
			}
			if caches[0].Len() != len(toks) || caches[1].Len() != len(toks) {
				t.Errorf("cache lengths %d, %d", caches[0].Len(), caches[1].Len())
			}
			// A cache at MaxSeq refuses more tokens.
			c := whole.NewCache()
			long := make([]int32, cfg.MaxSeq)
			if _, err := whole.Infer(c, model.Input{Batch: 1, Seq: cfg.MaxSeq, Tokens: long}); err != nil {
				t.Fatal(err)
			}
			if _, err := whole.Infer(c, model.Input{Batch: 1, Seq: 1, Tokens: []int32{1}}); !errors.Is(err, model.ErrContextFull) {
				t.Errorf("decoding past MaxSeq: %v, want ErrContextFull", err)
			}
		})
	}
}

// TestExportDenseComputesTheSameModel loads a constrained model's dense
// export (W = U·Z, E = Z_emb·Uᵀ + E_fix) into an unconstrained model of the
// same shape and compares the logits.
func TestExportDenseComputesTheSameModel(t *testing.T) {
	cfg := variants(2)["subspace-dense-tail"]
	sub, err := model.New(cfg, model.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	modeltest.Perturb(t, perturbed, sub.Stage)
	plain := cfg
	plain.Subspace = model.SubspaceConfig{}
	dense, err := model.New(plain)
	if err != nil {
		t.Fatal(err)
	}
	exported := sub.ExportDense()
	if len(exported) != len(dense.Params()) {
		t.Fatalf("export has %d tensors, a dense model %d", len(exported), len(dense.Params()))
	}
	for _, x := range exported {
		p, ok := dense.Param(x.Name)
		if !ok || !slices.Equal(p.Shape, x.Shape) {
			t.Fatalf("exported %s %v has no match in the dense model", x.Name, x.Shape)
		}
		if err := p.Set(x.Data); err != nil {
			t.Fatal(err)
		}
	}
	in := model.Input{Batch: 1, Seq: 6, Tokens: []int32{4, 2, 9, 0, 12, 4}, NoGrad: true}
	a, err := sub.Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dense.Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	if e := tt.RelErr(b.Logits, tt.F64(a.Logits)); e > 1e-5 {
		t.Errorf("dense export's logits differ by %.3g", e)
	}
}

func TestHuggingFaceNamesAndShapes(t *testing.T) {
	cfg := tiny(2)
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, kv, f, v := cfg.Dim, cfg.KVDim(), cfg.FFNDim, cfg.Vocab
	want := map[string][]int{
		"model.embed_tokens.weight":                      {v, d},
		"model.layers.1.input_layernorm.weight":          {d},
		"model.layers.1.self_attn.q_proj.weight":         {d, d},
		"model.layers.1.self_attn.k_proj.weight":         {kv, d},
		"model.layers.1.self_attn.v_proj.weight":         {kv, d},
		"model.layers.1.self_attn.o_proj.weight":         {d, d},
		"model.layers.1.post_attention_layernorm.weight": {d},
		"model.layers.1.mlp.gate_proj.weight":            {f, d},
		"model.layers.1.mlp.up_proj.weight":              {f, d},
		"model.layers.1.mlp.down_proj.weight":            {d, f},
		"model.norm.weight":                              {d},
		"lm_head.weight":                                 {v, d},
	}
	for name, shape := range want {
		p, ok := m.Param(name)
		if !ok || !slices.Equal(p.Shape, shape) {
			t.Errorf("%s: got %v, want shape %v", name, p, shape)
		}
	}
	var total int64
	for _, p := range m.Params() {
		total += int64(p.Len())
		if p.Decay == (len(p.Shape) == 1) {
			t.Errorf("%s: decay %v", p.Name, p.Decay)
		}
	}
	if total != cfg.ParamCount() {
		t.Errorf("ParamCount %d, parameters hold %d", cfg.ParamCount(), total)
	}
	for name, c := range variants(2) {
		mm, err := model.New(c)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, p := range mm.Params() {
			n += int64(p.Len())
		}
		if n != c.ParamCount() {
			t.Errorf("%s: ParamCount %d, parameters hold %d", name, c.ParamCount(), n)
		}
	}
	sub, _ := model.New(variants(2)["subspace"])
	for _, name := range []string{"model.embed_tokens.z", "model.layers.0.self_attn.o_proj.z", "model.layers.1.mlp.down_proj.z"} {
		if p, ok := sub.Param(name); !ok || p.Shape[0] != 3 && name != "model.embed_tokens.z" {
			t.Errorf("subspace model lacks %s (%v)", name, p)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := tiny(2)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for field, mutate := range map[string]func(*model.Config){
		"Vocab":              func(c *model.Config) { c.Vocab = 0 },
		"Dim":                func(c *model.Config) { c.Dim = -1 },
		"Layers":             func(c *model.Config) { c.Layers = 0 },
		"Heads":              func(c *model.Config) { c.Heads = 3 },
		"head dim":           func(c *model.Config) { c.Heads = 8 },
		"KVHeads":            func(c *model.Config) { c.KVHeads = 3 },
		"FFNDim":             func(c *model.Config) { c.FFNDim = 0 },
		"MaxSeq":             func(c *model.Config) { c.MaxSeq = 0 },
		"RopeTheta":          func(c *model.Config) { c.RopeTheta = -1 },
		"NormEps":            func(c *model.Config) { c.NormEps = math.NaN() },
		"Subspace.Rank":      func(c *model.Config) { c.Subspace.Rank = 9 },
		"Subspace.DenseTail": func(c *model.Config) { c.Subspace = model.SubspaceConfig{Rank: 2, DenseTail: 3} },
		"TieEmbeddings":      func(c *model.Config) { c.Subspace.Rank = 2; c.TieEmbeddings = true },
	} {
		c := good
		mutate(&c)
		err := c.Validate()
		if !errors.Is(err, model.ErrConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate() = %v", field, err)
		}
		if _, err := model.New(c); err == nil {
			t.Errorf("%s: New accepted a bad config", field)
		}
	}
	for _, span := range []model.Span{{First: 1, Last: 2, Embed: true}, {First: 0, Last: 1, Head: true}, {First: 1, Last: 1}, {First: 0, Last: 3}} {
		if _, err := model.NewStage(good, span); err == nil {
			t.Errorf("span %+v accepted", span)
		}
	}
	if _, err := model.New(good, model.WithSeed(1), model.WithSeed(2)); err == nil {
		t.Error("WithSeed given twice accepted")
	}
}

func TestInputValidation(t *testing.T) {
	cfg := variants(2)["subspace"]
	spans, _ := model.EvenSpans(2, 2)
	stages, err := model.NewStages(cfg, spans)
	if err != nil {
		t.Fatal(err)
	}
	first, last := stages[0], stages[1]
	d := cfg.Dim
	ok := model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, 2, 3}}
	hidden := make([]float32, 3*d)
	for _, c := range []struct {
		name string
		s    *model.Stage
		in   model.Input
	}{
		{"no tokens", first, model.Input{Batch: 1, Seq: 3}},
		{"token ≥ vocab", first, model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, 13, 2}}},
		{"negative token", first, model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, -1, 2}}},
		{"seq > MaxSeq", first, model.Input{Batch: 1, Seq: 17, Tokens: make([]int32, 17)}},
		{"position ≥ MaxSeq", first, model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, 2, 3}, Positions: []int32{0, 1, 16}}},
		{"positions count", first, model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, 2, 3}, Positions: []int32{0, 1}}},
		{"zero batch", first, model.Input{Seq: 3, Tokens: []int32{1, 2, 3}}},
		{"hidden to first", first, model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, 2, 3}, Hidden: hidden}},
		{"targets to first", first, model.Input{Batch: 1, Seq: 3, Tokens: []int32{1, 2, 3}, Targets: []int32{1, 2, 3}}},
		{"hidden shape", last, model.Input{Batch: 1, Seq: 3, Hidden: hidden[:2*d], Targets: []int32{1, 2, 3}}},
		{"hidden NaN", last, model.Input{Batch: 1, Seq: 3, Hidden: append(slices.Clone(hidden[:3*d-1]), float32(math.NaN())), Targets: []int32{1, 2, 3}}},
		{"no targets", last, model.Input{Batch: 1, Seq: 3, Hidden: hidden}},
		{"target ≥ vocab", last, model.Input{Batch: 1, Seq: 3, Hidden: hidden, Targets: []int32{1, 99, 3}}},
		{"negative LossTokens", last, model.Input{Batch: 1, Seq: 3, Hidden: hidden, Targets: []int32{1, 2, 3}, LossTokens: -1}},
	} {
		if _, err := c.s.Forward(0, c.in); !errors.Is(err, model.ErrInput) {
			t.Errorf("%s: error %v, want ErrInput", c.name, err)
		}
	}
	if len(first.InFlight()) != 0 || len(last.InFlight()) != 0 {
		t.Fatal("a rejected input left a microbatch in flight")
	}
	if _, err := first.Forward(0, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Forward(0, ok); !errors.Is(err, model.ErrMicrobatchBusy) {
		t.Errorf("second forward of microbatch 0: %v", err)
	}
	if _, err := first.Backward(1, hidden); !errors.Is(err, model.ErrUnknownMicrobatch) {
		t.Errorf("backward of an unknown microbatch: %v", err)
	}
	if _, err := first.Backward(0, hidden[:d]); !errors.Is(err, model.ErrInput) {
		t.Errorf("short gradient: %v", err)
	}
	bad := slices.Clone(hidden)
	bad[5] = float32(math.Inf(1))
	if _, err := first.Backward(0, bad); !errors.Is(err, model.ErrInput) {
		t.Errorf("infinite gradient: %v", err)
	}
	if g, err := first.Backward(0, hidden); err != nil || g != nil {
		t.Errorf("valid backward after rejected ones: %v, %v", g, err)
	}
	if _, err := last.Forward(0, model.Input{Batch: 1, Seq: 3, Hidden: hidden, Targets: []int32{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if _, err := last.Backward(0, hidden); !errors.Is(err, model.ErrInput) {
		t.Errorf("gradient given to the head stage: %v", err)
	}
	last.Drop(0)
	if len(last.InFlight()) != 0 {
		t.Error("Drop left the microbatch in flight")
	}
}

// TestSubspaceBoundaryIsLossless sends the boundary of a constrained
// two-stage model as k coefficients per token both ways (what the wire
// codec does with subspace.Basis) and checks that the loss and every
// gradient match the uncompressed run.
func TestSubspaceBoundaryIsLossless(t *testing.T) {
	cfg := model.Config{Vocab: 40, Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, FFNDim: 40, MaxSeq: 16,
		Subspace: model.SubspaceConfig{Rank: 6, Seed: 3}}
	spans, _ := model.EvenSpans(2, 2)
	mbs, total := batch(cfg, 4)
	runPair := func(compress bool) (float64, map[string][]float32) {
		stages, err := model.NewStages(cfg, spans, model.WithSeed(7))
		if err != nil {
			t.Fatal(err)
		}
		modeltest.Perturb(t, perturbed, stages...)
		basis := stages[0].Basis()
		k := basis.Rank()
		var loss float64
		for i, mb := range mbs {
			toks := make([]int, len(mb.Tokens))
			for j, tok := range mb.Tokens {
				toks[j] = int(tok)
			}
			n := len(toks)
			out0, err := stages[0].Forward(i, model.Input{Batch: mb.Batch, Seq: mb.Seq, Tokens: mb.Tokens, Positions: mb.Positions})
			if err != nil {
				t.Fatal(err)
			}
			hidden := out0.Hidden
			if compress {
				c := make([]float32, n*k)
				if r := basis.Encode(hidden, toks, c); r > 1e-5 {
					t.Fatalf("boundary residual %.3g", r)
				}
				hidden = make([]float32, n*cfg.Dim)
				basis.Decode(c, toks, hidden)
			}
			out1, err := stages[1].Forward(i, model.Input{Batch: mb.Batch, Seq: mb.Seq, Tokens: mb.Tokens, Positions: mb.Positions,
				Hidden: hidden, Targets: mb.Targets, LossTokens: total})
			if err != nil {
				t.Fatal(err)
			}
			loss += out1.Loss
			g, err := stages[1].Backward(i, nil)
			if err != nil {
				t.Fatal(err)
			}
			if compress {
				gc := make([]float32, n*k)
				basis.ProjectGrad(g, n, gc)
				basis.LiftGrad(gc, n, g)
			}
			if _, err := stages[0].Backward(i, g); err != nil {
				t.Fatal(err)
			}
		}
		grads := map[string][]float32{}
		for _, s := range stages {
			for _, p := range s.Params() {
				grads[p.Name] = p.GradData()
			}
		}
		return loss, grads
	}
	l0, g0 := runPair(false)
	l1, g1 := runPair(true)
	if math.Abs(l0-l1) > 1e-5*l0 {
		t.Errorf("loss %.8g uncompressed, %.8g through k=%d coefficients", l0, l1, cfg.Subspace.Rank)
	}
	worst := 0.0
	for name, g := range g0 {
		e := tt.RelErr(g1[name], tt.F64(g))
		worst = math.Max(worst, e)
		if e > 1e-4 {
			t.Errorf("%s: gradient through the compressed boundary differs by %.3g", name, e)
		}
	}
	t.Logf("wire d=%d → k=%d: loss %.6f vs %.6f, worst gradient rel diff %.2e", cfg.Dim, cfg.Subspace.Rank, l0, l1, worst)
}
