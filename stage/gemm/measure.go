package gemm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// SgemmFunc has Sgemm's signature, so that other implementations (gonum,
// OpenBLAS) can be measured the same way.
type SgemmFunc func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

// MeasureGFLOPS times f on random m×k and k×n matrices (no transposes,
// beta 0) and returns the best rate seen, in GFLOP/s counting 2·m·n·k per
// call. It repeats until minTime has passed (and at least twice after one
// warm-up call); the best run, not the mean, is reported because other
// processes only ever slow a run down.
func MeasureGFLOPS(ctx context.Context, m, n, k int, minTime time.Duration, f SgemmFunc) (float64, error) {
	if m <= 0 || n <= 0 || k <= 0 {
		return 0, fmt.Errorf("gemm: measure needs positive sizes, got %d×%d×%d", m, n, k)
	}
	rng := rand.New(rand.NewPCG(uint64(m), uint64(n*k)))
	a := randomMatrix(rng, m*k)
	b := randomMatrix(rng, k*n)
	c := make([]float32, m*n)
	call := func() { f(false, false, m, n, k, 1, a, k, b, n, 0, c, n) }
	call() // warm caches, pools and the CPU clock
	flop := 2 * float64(m) * float64(n) * float64(k)
	var best float64
	start := time.Now()
	for runs := 0; runs < 2 || time.Since(start) < minTime; runs++ {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("gemm: measure: %w", err)
		}
		t := time.Now()
		call()
		if r := flop / time.Since(t).Seconds() / 1e9; r > best {
			best = r
		}
	}
	return best, nil
}

func randomMatrix(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = rng.Float32()*2 - 1
	}
	return x
}

// GonumSgemm is gonum's blas32 (pure Go, parallel) behind Sgemm's
// signature: the baseline Sgemm is measured against.
func GonumSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ta, tb := blas.NoTrans, blas.NoTrans
	if transA {
		ta = blas.Trans
	}
	if transB {
		tb = blas.Trans
	}
	blas32.Implementation().Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}
