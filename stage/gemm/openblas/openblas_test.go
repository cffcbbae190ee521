package openblas

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/holopeer/holopeer/stage/gemm"
)

// TestMatchesSgemm checks the comparison is a fair one: same results as
// gemm.Sgemm for every transpose on an odd shape with strides.
func TestMatchesSgemm(t *testing.T) {
	f, ok := Func()
	if !ok {
		t.Skip("built without -tags openblas")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	const m, n, k = 37, 29, 53
	for tr := range 4 {
		tA, tB := tr&1 != 0, tr&2 != 0
		lda, ldb := k+1, n+2
		if tA {
			lda = m + 1
		}
		if tB {
			ldb = k + 2
		}
		a := make([]float32, 64*lda)
		b := make([]float32, 64*ldb)
		for i := range a {
			a[i] = rng.Float32() - 0.5
		}
		for i := range b {
			b[i] = rng.Float32() - 0.5
		}
		c1 := make([]float32, m*(n+3))
		for i := range c1 {
			c1[i] = rng.Float32()
		}
		c2 := append([]float32(nil), c1...)
		f(tA, tB, m, n, k, 1.5, a, lda, b, ldb, 0.5, c1, n+3)
		gemm.Sgemm(tA, tB, m, n, k, 1.5, a, lda, b, ldb, 0.5, c2, n+3)
		for i := range c1 {
			if math.Abs(float64(c1[i]-c2[i])) > 1e-4 {
				t.Fatalf("tA=%v tB=%v: c[%d] openblas %g, gemm %g", tA, tB, i, c1[i], c2[i])
			}
		}
	}
}

// BenchmarkOpenBLAS1024 and BenchmarkSgemm1024 measure both at 1024³ in
// the same process (go test -tags openblas -bench . ./stage/gemm/openblas).
func BenchmarkOpenBLAS1024(b *testing.B) {
	f, ok := Func()
	if !ok {
		b.Skip("built without -tags openblas")
	}
	bench1024(b, f)
}

func BenchmarkSgemm1024(b *testing.B) { bench1024(b, gemm.Sgemm) }

func bench1024(b *testing.B, f gemm.SgemmFunc) {
	const n = 1024
	x, y, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range x {
		x[i], y[i] = float32(i%7)-3, float32(i%5)-2
	}
	for b.Loop() {
		f(false, false, n, n, n, 1, x, n, y, n, 0, c, n)
	}
	b.ReportMetric(2*n*n*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
