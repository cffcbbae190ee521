package model_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
)

// A stage built WithValues from another stage's tensors computes the same
// function, and WithoutGrad keeps inference working while refusing
// training.
func TestWithValuesWithoutGradServes(t *testing.T) {
	cfg := tiny(2)
	span := model.Span{First: 0, Last: 2, Embed: true, Head: true}
	src, err := model.NewStage(cfg, span, model.WithSeed(7))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	load := func(name string, shape []int, off int, dst []float32) error {
		p, ok := src.Param(name)
		if !ok || !slices.Equal(p.Shape, shape) {
			t.Fatalf("asked for %s%v", name, shape)
		}
		copy(dst, p.Data()[off:])
		return nil
	}
	st, err := model.NewStage(cfg, span, model.WithValues(load), model.WithoutGrad())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Trainable() || !src.Trainable() {
		t.Fatal("Trainable is wrong")
	}
	ins, _ := batch(cfg, 3)
	in := ins[0]
	in.NoGrad, in.Targets = true, nil
	want, err := src.Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Logits) == 0 || !slices.Equal(want.Logits, got.Logits) {
		t.Fatal("a stage loaded WithValues computes another function")
	}
	in.NoGrad, in.Targets = false, ins[0].Targets
	if _, err := st.Forward(1, in); !errors.Is(err, model.ErrNoGrad) {
		t.Fatalf("training forward on an inference stage: %v, want ErrNoGrad", err)
	}
	st.ZeroGrad() // must not touch absent buffers
}

// A loader that fails or yields a non-finite value gets an error naming
// the tensor, and nothing leaks.
func TestWithValuesRefusesBadValues(t *testing.T) {
	cfg := tiny(1)
	span := model.Span{First: 0, Last: 1}
	boom := errors.New("boom")
	_, err := model.NewStage(cfg, span, model.WithValues(func(string, []int, int, []float32) error { return boom }))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	_, err = model.NewStage(cfg, span, model.WithValues(func(_ string, _ []int, _ int, dst []float32) error {
		dst[0] = float32(posInf())
		return nil
	}))
	if err == nil {
		t.Fatal("a non-finite value was accepted")
	}
}

func posInf() float64 { var z float64; return 1 / z }

// TestBFloat16WeightsServe: an inference stage built WithWeightDType(BFloat16)
// from values on the bfloat16 grid holds its matrices at 2 bytes, exports
// exactly the values it was given, and computes the float32 stage's logits
// to float32 rounding; a training stage asked for bfloat16 stays float32.
func TestBFloat16WeightsServe(t *testing.T) {
	cfg := tiny(2)
	span := model.Whole(cfg)
	src, err := model.NewStage(cfg, span, model.WithSeed(3))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, p := range src.Params() {
		d := p.Data()
		for i, v := range d {
			d[i] = safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v))
		}
		if err := p.Set(d); err != nil {
			t.Fatal(err)
		}
	}
	load := func(name string, shape []int, off int, dst []float32) error {
		p, _ := src.Param(name)
		copy(dst, p.Data()[off:])
		return nil
	}
	st, err := model.NewStage(cfg, span, model.WithValues(load), model.WithoutGrad(), model.WithWeightDType(tensor.BFloat16))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.WeightDType() != tensor.BFloat16 {
		t.Fatalf("stored as %v", st.WeightDType())
	}
	for _, p := range st.Params() {
		want := tensor.Float32
		if len(p.Shape) == 2 {
			want = tensor.BFloat16
		}
		if p.Value.DType() != want {
			t.Fatalf("%s stored as %v, want %v", p.Name, p.Value.DType(), want)
		}
		q, _ := src.Param(p.Name)
		if !slices.Equal(p.Data(), q.Data()) {
			t.Fatalf("%s does not read back the values it was given", p.Name)
		}
	}
	ins, _ := batch(cfg, 3)
	in := ins[0]
	in.NoGrad, in.Targets = true, nil
	want, err := src.Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Forward(0, in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want.Logits {
		if d := math.Abs(float64(got.Logits[i] - want.Logits[i])); d > 1e-4 {
			t.Fatalf("logit %d: %g with bfloat16 weights, %g with float32", i, got.Logits[i], want.Logits[i])
		}
	}
	tr, err := model.NewStage(cfg, span, model.WithValues(load), model.WithWeightDType(tensor.BFloat16))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.WeightDType() != tensor.Float32 {
		t.Fatal("a training stage must keep float32 master weights")
	}
}

// TestWithValuesLoadsInSlices: a tensor larger than the load slice is
// asked for in bounded, contiguous slices that cover it exactly, and lands
// whole.
func TestWithValuesLoadsInSlices(t *testing.T) {
	cfg := model.Config{Vocab: 300, Dim: 4096, Layers: 1, Heads: 32, KVHeads: 8, FFNDim: 64, MaxSeq: 8}
	span := model.Span{Embed: true}
	next, largest := 0, 0
	load := func(name string, shape []int, off int, dst []float32) error {
		if off != next {
			t.Fatalf("%s: slice at %d, want %d", name, off, next)
		}
		next, largest = off+len(dst), max(largest, len(dst))
		for i := range dst {
			dst[i] = float32(off + i)
		}
		return nil
	}
	st, err := model.NewStage(cfg, span, model.WithValues(load), model.WithoutGrad())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p := st.Params()[0]
	if next != p.Len() || largest >= p.Len() || largest > 1<<20 {
		t.Fatalf("loaded %d of %d values, largest slice %d", next, p.Len(), largest)
	}
	for i, v := range p.Data() {
		if v != float32(i) {
			t.Fatalf("element %d is %g", i, v)
		}
	}
}
