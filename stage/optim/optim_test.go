package optim_test

import (
	"math"
	"slices"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
	tt "github.com/holopeer/holopeer/stage/tensor/tensortest"
)

func TestSchedule(t *testing.T) {
	s := optim.Schedule{Peak: 1, Min: 0.1, Warmup: 4, Total: 14}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for step, want := range map[int]float64{
		0: 0.25, 1: 0.5, 3: 1, // linear warmup reaches the peak at the last warmup step
		4:  1,             // cosine starts at the peak
		9:  0.1 + 0.9*0.5, // half way down
		14: 0.1, 100: 0.1, // then the floor
	} {
		if got := s.LR(step); math.Abs(got-want) > 1e-12 {
			t.Errorf("LR(%d) = %g, want %g", step, got, want)
		}
	}
	prev := math.Inf(1)
	for step := 4; step <= 14; step++ {
		if lr := s.LR(step); lr > prev {
			t.Fatalf("LR rises after warmup at step %d", step)
		} else {
			prev = lr
		}
	}
	for _, bad := range []optim.Schedule{{Peak: 0}, {Peak: 1, Min: 2}, {Peak: 1, Warmup: 5, Total: 3}, {Peak: math.NaN()}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestClipScale(t *testing.T) {
	if got := optim.ClipScale(9, 5); got != 1 {
		t.Errorf("norm 3 under 5: scale %g", got)
	}
	if got := optim.ClipScale(100, 5); math.Abs(got-0.5) > 1e-6 {
		t.Errorf("norm 10 clipped to 5: scale %g", got)
	}
	if got := optim.ClipScale(100, 0); got != 1 {
		t.Errorf("clipping disabled: scale %g", got)
	}
}

func newStage(t *testing.T) *model.Model {
	t.Helper()
	m, err := model.New(model.Config{Vocab: 11, Dim: 8, Layers: 1, Heads: 2, KVHeads: 1, FFNDim: 8, MaxSeq: 8}, model.WithSeed(2))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fill gives every parameter the same gradient pattern.
func fill(t *testing.T, m *model.Model) {
	for _, p := range m.Params() {
		g := make([]float32, p.Len())
		for i := range g {
			g[i] = float32(math.Sin(float64(i)+float64(len(p.Name)))) * 0.1
		}
		if err := p.SetGrad(g); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStepMatchesReference checks the update, decay only on matrices, and
// the gradient scale, against the float64 AdamW reference.
func TestStepMatchesReference(t *testing.T) {
	m := newStage(t)
	be := m.Backend()
	cfg := optim.Config{Beta1: 0.8, Beta2: 0.9, Eps: 1e-6, WeightDecay: 0.2}
	opt, err := optim.New(be, cfg)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, m)
	before := map[string][]float32{}
	for _, p := range m.Params() {
		before[p.Name] = p.Data()
	}
	if err := opt.Step(m.Params(), 0.01, 0.5); err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params() {
		wd := 0.2
		if len(p.Shape) == 1 {
			wd = 0 // norm gains are not decayed
		}
		n := p.Len()
		want, _, _ := tt.RefAdamW(tt.F64(before[p.Name]), tt.F64(p.GradData()), make([]float64, n), make([]float64, n),
			refStep(cfg, 0.01, 0.5, wd))
		if e := tt.RelErr(p.Data(), want); e > 1e-6 {
			t.Errorf("%s: update differs from reference by %.3g", p.Name, e)
		}
	}
	if opt.Steps() != 1 {
		t.Errorf("Steps() = %d", opt.Steps())
	}
	if got := optim.SumSquares(be, m.Params()); got <= 0 {
		t.Errorf("SumSquares = %g", got)
	}
}

// TestStateRoundTrip: an optimizer restored from StateTensors continues
// exactly like the one it was saved from.
func TestStateRoundTrip(t *testing.T) {
	a, b := newStage(t), newStage(t)
	oa, _ := optim.New(a.Backend(), optim.DefaultConfig())
	fill(t, a)
	if err := oa.Step(a.Params(), 1e-2, 1); err != nil {
		t.Fatal(err)
	}
	for _, p := range a.Params() {
		q, _ := b.Param(p.Name)
		if err := q.Set(p.Data()); err != nil {
			t.Fatal(err)
		}
	}
	ob, _ := optim.New(b.Backend(), optim.DefaultConfig())
	if err := ob.LoadState(oa.Steps(), b.Params(), oa.StateTensors(a.Params())); err != nil {
		t.Fatal(err)
	}
	fill(t, a)
	fill(t, b)
	if err := oa.Step(a.Params(), 1e-2, 1); err != nil {
		t.Fatal(err)
	}
	if err := ob.Step(b.Params(), 1e-2, 1); err != nil {
		t.Fatal(err)
	}
	for _, p := range a.Params() {
		q, _ := b.Param(p.Name)
		if !slices.Equal(p.Data(), q.Data()) {
			t.Fatalf("%s diverged after restoring the optimizer state", p.Name)
		}
	}
	bad := oa.StateTensors(a.Params())
	bad[0].Data = bad[0].Data[1:]
	if ob.LoadState(1, b.Params(), bad) == nil {
		t.Error("LoadState accepted a short tensor")
	}
	if ob.LoadState(1, b.Params(), []model.HostTensor{{Name: "optim.adamw.m.nope"}}) == nil {
		t.Error("LoadState accepted state for an unknown parameter")
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := optim.New(cpu.New(), optim.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []optim.Config{{Beta1: 1, Beta2: 0.9, Eps: 1e-8}, {Beta1: 0.9, Beta2: -0.1, Eps: 1e-8}, {Beta1: 0.9, Beta2: 0.9}, {Beta1: 0.9, Beta2: 0.9, Eps: 1e-8, WeightDecay: 1}} {
		if _, err := optim.New(cpu.New(), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	m := newStage(t)
	opt, _ := optim.New(m.Backend(), optim.DefaultConfig())
	if opt.Step(m.Params(), math.NaN(), 1) == nil || opt.Step(m.Params(), 1, math.Inf(1)) == nil {
		t.Error("Step accepted a non-finite learning rate or scale")
	}
}

func refStep(c optim.Config, lr, scale, wd float64) tensor.AdamWStep {
	return tensor.AdamWStep{LR: float32(lr), Beta1: float32(c.Beta1), Beta2: float32(c.Beta2), Eps: float32(c.Eps),
		WeightDecay: float32(wd), GradScale: float32(scale), Step: 1}
}
