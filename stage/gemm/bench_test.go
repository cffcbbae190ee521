package gemm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

func benchSgemm(b *testing.B, f SgemmFunc, transA, transB bool, m, n, k int) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := randomMatrix(rng, m*k)
	y := randomMatrix(rng, k*n)
	c := make([]float32, m*n)
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f(transA, transB, m, n, k, 1, x, lda, y, ldb, 0, c, n)
	}
	b.ReportMetric(2*float64(m)*float64(n)*float64(k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkSgemm1024 is the headline figure: 1024³ with the kernel chosen
// for this machine on all cores.
func BenchmarkSgemm1024(b *testing.B) { benchSgemm(b, Sgemm, false, false, 1024, 1024, 1024) }

func BenchmarkGonumSgemm1024(b *testing.B) { benchSgemm(b, GonumSgemm, false, false, 1024, 1024, 1024) }

// BenchmarkSgemmKernels runs every kernel this machine has at 1024³, on all
// cores and on one.
func BenchmarkSgemmKernels(b *testing.B) {
	for _, kr := range kernels {
		for _, threads := range []int{0, 1} {
			b.Run(fmt.Sprintf("%s/threads=%d", kr.name, threads), func(b *testing.B) {
				withKernel(kr, threads, func() { benchSgemm(b, Sgemm, false, false, 1024, 1024, 1024) })
			})
		}
	}
}

// BenchmarkSgemmShapes covers transposes and the model's smaller shapes.
func BenchmarkSgemmShapes(b *testing.B) {
	for _, s := range []struct {
		tA, tB  bool
		m, n, k int
	}{
		{false, false, 256, 256, 256},
		{false, true, 1024, 1024, 1024},
		{true, false, 1024, 1024, 1024},
		{false, false, 64, 8, 256},
		{false, false, 512, 2048, 512},
		{false, false, 1, 4096, 1024},
	} {
		b.Run(fmt.Sprintf("tA=%v,tB=%v,%dx%dx%d", s.tA, s.tB, s.m, s.n, s.k), func(b *testing.B) {
			benchSgemm(b, Sgemm, s.tA, s.tB, s.m, s.n, s.k)
		})
	}
}

func BenchmarkPeakGFLOPS(b *testing.B) {
	for b.Loop() {
		measurePeak()
	}
	p, how := PeakGFLOPS()
	b.ReportMetric(p, "GFLOP/s")
	b.Log(how)
}

func TestMeasureGFLOPS(t *testing.T) {
	g, err := MeasureGFLOPS(context.Background(), 32, 32, 32, 0, Sgemm)
	if err != nil || !(g > 0) {
		t.Fatalf("MeasureGFLOPS = %g, %v", g, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := MeasureGFLOPS(ctx, 32, 32, 32, 0, Sgemm); err == nil {
		t.Fatal("cancelled context: no error")
	}
	if _, err := MeasureGFLOPS(context.Background(), 0, 1, 1, 0, Sgemm); err == nil {
		t.Fatal("zero size: no error")
	}
}

func TestPeakGFLOPS(t *testing.T) {
	p, how := PeakGFLOPS()
	if !(p > 0) || how == "" {
		t.Fatalf("PeakGFLOPS = %g, %q", p, how)
	}
	t.Log(p, how)
}
