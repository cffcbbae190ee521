package cpu_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
	"github.com/holopeer/holopeer/stage/tensor/tensortest"
)

func TestOpsAgainstFloat64Reference(t *testing.T) {
	tensortest.CheckBackend(t, cpu.New())
}

// The cpu backend must give bit-identical results whatever its worker
// count, so that runs are reproducible across machines with other core
// counts.
func TestWorkerCountDoesNotChangeResults(t *testing.T) {
	tensortest.CheckParity(t, cpu.New(cpu.WithWorkers(1)), cpu.New(cpu.WithWorkers(5)), math.SmallestNonzeroFloat64)
}

func TestLargeReductionsIndependentOfWorkers(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const rows, dim, vocab = 300, 96, 17
	x, dy, w := rnd(r, rows*dim), rnd(r, rows*dim), rnd(r, dim)
	ids := make([]int32, rows)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	run := func(be *cpu.Backend) (dw, table []float32, ss float64) {
		xb, wb := up(be, x), up(be, w)
		out, rstd := be.Alloc(tensor.Float32, rows*dim), be.Alloc(tensor.Float32, rows)
		be.RMSNorm(out, rstd, xb, wb, dim, 1e-6)
		dx, dwb := be.Alloc(tensor.Float32, rows*dim), be.Alloc(tensor.Float32, dim)
		be.RMSNormBackward(dx, dwb, up(be, dy), xb, wb, rstd, dim)
		tb := be.Alloc(tensor.Float32, vocab*dim)
		idb := be.Alloc(tensor.Int32, rows)
		be.UploadInt32(idb, ids)
		be.ScatterAdd(tb, idb, up(be, dy), dim)
		return down(be, dwb), down(be, tb), be.SumSquares(up(be, append(x, dy...)))
	}
	dw1, t1, s1 := run(cpu.New(cpu.WithWorkers(1)))
	dw2, t2, s2 := run(cpu.New(cpu.WithWorkers(7)))
	if !slices.Equal(dw1, dw2) || !slices.Equal(t1, t2) || s1 != s2 {
		t.Fatal("results depend on the worker count")
	}
}

func TestRegistry(t *testing.T) {
	be, err := tensor.Open("cpu")
	if err != nil || be.Name() != "cpu" {
		t.Fatalf("Open(cpu) = %v, %v", be, err)
	}
	if be, err := tensor.Open("auto"); err != nil || be == nil {
		t.Fatalf("Open(auto) = %v, %v", be, err)
	}
	if _, err := tensor.Open("no-such-device"); !errors.Is(err, tensor.ErrUnknownBackend) {
		t.Fatalf("Open(unknown) error = %v, want ErrUnknownBackend", err)
	}
	if !slices.Contains(tensor.Backends(), "cpu") {
		t.Fatalf("Backends() = %v lacks cpu", tensor.Backends())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering cpu twice did not panic")
		}
	}()
	tensor.Register("cpu", 0, nil)
}

func TestMisuseFailsLoudly(t *testing.T) {
	be := cpu.New()
	for name, f := range map[string]func(){
		"gemm shape": func() {
			be.Gemm(false, false, 2, 2, 2, 1, be.Alloc(tensor.Float32, 3), be.Alloc(tensor.Float32, 4), 0, be.Alloc(tensor.Float32, 4))
		},
		"int as float": func() { be.Fill(be.Alloc(tensor.Int32, 3), 1) },
		"view range":   func() { be.View(be.Alloc(tensor.Float32, 3), 2, 2) },
		"gather id": func() {
			ids := be.Alloc(tensor.Int32, 1)
			be.UploadInt32(ids, []int32{5})
			be.Gather(be.Alloc(tensor.Float32, 2), be.Alloc(tensor.Float32, 4), ids, 2)
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func rnd(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func up(be tensor.Backend, x []float32) tensor.Buffer {
	b := be.Alloc(tensor.Float32, len(x))
	be.Upload(b, x)
	return b
}

func down(be tensor.Backend, b tensor.Buffer) []float32 {
	x := make([]float32, b.Len())
	be.Download(x, b)
	return x
}

// TestBFloat16Weights: a bfloat16 buffer stores values rounded to the
// bfloat16 grid, Gemm with it as B and Gather from it give what the
// float32 ops give on the widened values, and a view shares its memory.
func TestBFloat16Weights(t *testing.T) {
	be := cpu.New()
	if !tensor.Supports(be, tensor.BFloat16) {
		t.Fatal("the cpu backend must support bfloat16")
	}
	const n, k, m = 9, 13, 3
	rng := rand.New(rand.NewPCG(3, 4))
	w := make([]float32, n*k)
	for i := range w {
		w[i] = rng.Float32()*2 - 1
	}
	wb := be.Alloc(tensor.BFloat16, n*k)
	be.Upload(wb, w)
	got := make([]float32, n*k)
	be.Download(got, wb)
	for i := range w {
		if want := safetensors.BF16ToFloat32(safetensors.Float32ToBF16(w[i])); got[i] != want {
			t.Fatalf("element %d: stored %g, want %g (rounded from %g)", i, got[i], want, w[i])
		}
	}
	wf := be.Alloc(tensor.Float32, n*k)
	be.Upload(wf, got)

	x := be.Alloc(tensor.Float32, m*k)
	xs := make([]float32, m*k)
	for i := range xs {
		xs[i] = rng.Float32()
	}
	be.Upload(x, xs)
	y16, y32 := be.Alloc(tensor.Float32, m*n), be.Alloc(tensor.Float32, m*n)
	be.Gemm(false, true, m, n, k, 1, x, wb, 0, y16)
	be.Gemm(false, true, m, n, k, 1, x, wf, 0, y32)
	a, b := make([]float32, m*n), make([]float32, m*n)
	be.Download(a, y16)
	be.Download(b, y32)
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-5 {
			t.Fatalf("Gemm with a bfloat16 B: C[%d] = %g, float32 %g", i, a[i], b[i])
		}
	}

	ids := be.Alloc(tensor.Int32, 2)
	be.UploadInt32(ids, []int32{4, 0})
	rows := be.Alloc(tensor.Float32, 2*k)
	be.Gather(rows, wb, ids, k)
	r := make([]float32, 2*k)
	be.Download(r, rows)
	if !slices.Equal(r[:k], got[4*k:5*k]) || !slices.Equal(r[k:], got[:k]) {
		t.Fatal("Gather from a bfloat16 table does not return its widened rows")
	}

	v := be.View(wb, k, k)
	if v.DType() != tensor.BFloat16 || v.Len() != k {
		t.Fatalf("view: %v of %d", v.DType(), v.Len())
	}
	be.Upload(v, make([]float32, k))
	be.Download(got, wb)
	if got[k] != 0 || got[2*k-1] != 0 {
		t.Fatal("a view of a bfloat16 buffer does not share its memory")
	}
}
