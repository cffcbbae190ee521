package model_test

import (
	"math"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	tt "github.com/holopeer/holopeer/stage/tensor/tensortest"
)

// llama3InvFreq is transformers' _compute_llama3_parameters in float64.
func llama3InvFreq(theta float64, hd int, r model.RopeScaling) []float64 {
	f := tt.RefInvFreq(theta, hd)
	lowW := float64(r.OriginalMaxPositions) / r.LowFreqFactor
	highW := float64(r.OriginalMaxPositions) / r.HighFreqFactor
	for i, inv := range f {
		wavelen := 2 * math.Pi / inv
		switch {
		case wavelen < highW:
		case wavelen > lowW:
			f[i] = inv / r.Factor
		default:
			smooth := (float64(r.OriginalMaxPositions)/wavelen - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
			f[i] = (1-smooth)*inv/r.Factor + smooth*inv
		}
	}
	return f
}

func TestRopeInvFreq(t *testing.T) {
	cfg := model.Config{Vocab: 10, Dim: 512, Layers: 1, Heads: 4, KVHeads: 1, FFNDim: 8, MaxSeq: 8, RopeTheta: 500000}
	if e := tt.RelErr(model.RopeInvFreq(cfg), tt.RefInvFreq(500000, 128)); e > 1e-6 {
		t.Errorf("default frequencies differ from theta^(-2i/d) by %.3g", e)
	}
	// Llama 3.1 8B's rope_scaling.
	cfg.RopeScaling = model.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	got := model.RopeInvFreq(cfg)
	want := llama3InvFreq(500000, 128, cfg.RopeScaling)
	for i := range want {
		if e := math.Abs(float64(got[i])-want[i]) / want[i]; e > 1e-6 {
			t.Errorf("llama3 frequency %d: %g, want %g", i, got[i], want[i])
		}
	}
	base := tt.RefInvFreq(500000, 128)
	if got[0] != 1 || math.Abs(float64(got[63])*8-base[63]) > 1e-6*base[63] {
		t.Errorf("high frequencies must stay, low ones be divided by 8: %g, %g (base %g)", got[0], got[63], base[63])
	}
	for _, bad := range []model.RopeScaling{
		{Type: "yarn", Factor: 2},
		{Type: "llama3", Factor: 8, LowFreqFactor: 4, HighFreqFactor: 1, OriginalMaxPositions: 8192},
		{Factor: 8},
	} {
		c := cfg
		c.RopeScaling = bad
		if c.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
