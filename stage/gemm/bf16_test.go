package gemm

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// bf16Grid draws n values on the bfloat16 grid, as bfloat16 and widened, so
// the float32 reference multiplies exactly the same numbers.
func bf16Grid(rng *rand.Rand, n int) ([]uint16, []float32) {
	h := make([]uint16, n)
	f := make([]float32, n)
	for i := range h {
		h[i] = uint16(math.Float32bits(rng.Float32()*2-1) >> 16)
		f[i] = math.Float32frombits(uint32(h[i]) << 16)
	}
	return h, f
}

// TestSgemmBF16MatchesSgemm compares SgemmBF16 with Sgemm on the same
// (widened) B in every transpose, across slice boundaries, with strides,
// both beta kinds, and several worker counts; results must agree within
// float32 rounding and be bit-identical whatever the worker count.
func TestSgemmBF16MatchesSgemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	cases := []struct{ m, n, k int }{
		{1, 1, 1}, {1, 37, 5}, {3, 130, 64}, {4, 1030, 70}, {5, 9, 3}, {7, 300, 900}, {33, 65, 17}, {64, 520, 129},
	}
	for _, cs := range cases {
		for trans := range 4 {
			transA, transB := trans&1 != 0, trans&2 != 0
			ar, ac := cs.m, cs.k
			if transA {
				ar, ac = cs.k, cs.m
			}
			br, bc := cs.k, cs.n
			if transB {
				br, bc = cs.n, cs.k
			}
			lda, ldb, ldc := ac+1, bc+2, cs.n+3
			a := make([]float32, ar*lda)
			for i := range a {
				a[i] = rng.Float32()*2 - 1
			}
			bh, bf := bf16Grid(rng, br*ldb)
			c0 := make([]float32, cs.m*ldc)
			for i := range c0 {
				c0[i] = rng.Float32()
			}
			for _, beta := range []float32{0, 0.5} {
				want := slices.Clone(c0)
				Sgemm(transA, transB, cs.m, cs.n, cs.k, 1.5, a, lda, bf, ldb, beta, want, ldc)
				var first []float32
				for _, threads := range []int{1, 2, 3} {
					got := slices.Clone(c0)
					withKernel(activeKernel(), threads, func() {
						SgemmBF16(transA, transB, cs.m, cs.n, cs.k, 1.5, a, lda, bh, ldb, beta, got, ldc)
					})
					tol := float64(cs.k+4) * 1.2e-7 * 3
					for i := range got {
						if i%ldc >= cs.n {
							if got[i] != c0[i] {
								t.Fatalf("%+v tA=%v tB=%v: wrote padding C[%d]", cs, transA, transB, i)
							}
							continue
						}
						if d := math.Abs(float64(got[i] - want[i])); d > tol*float64(cs.k)*1.5+1e-6 {
							t.Fatalf("%+v tA=%v tB=%v beta=%g threads=%d: C[%d] = %g, Sgemm %g", cs, transA, transB, beta, threads, i, got[i], want[i])
						}
					}
					if first == nil {
						first = got
					} else if !slices.Equal(first, got) {
						t.Fatalf("%+v tA=%v tB=%v: result depends on the worker count", cs, transA, transB)
					}
				}
			}
		}
	}
}

func TestSgemmBF16Panics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a B too short for its shape did not panic")
		}
	}()
	SgemmBF16(false, true, 2, 3, 4, 1, make([]float32, 8), 4, make([]uint16, 11), 4, 0, make([]float32, 6), 3)
}

// BenchmarkGEMVBF16 is one decode token through a TinyLlama gate
// projection (1×2048 times 5632×2048ᵀ): float32 weights against bfloat16.
func BenchmarkGEMVBF16(b *testing.B) {
	const n, k = 5632, 2048
	rng := rand.New(rand.NewPCG(1, 2))
	a := make([]float32, 64*k)
	for i := range a {
		a[i] = rng.Float32()
	}
	bh, bf := bf16Grid(rng, n*k)
	for _, m := range []int{1, 4, 64} {
		c := make([]float32, m*n)
		b.Run("f32/m="+strconv.Itoa(m), func(b *testing.B) {
			b.SetBytes(int64(n * k * 4))
			for range b.N {
				Sgemm(false, true, m, n, k, 1, a[:m*k], k, bf, k, 0, c, n)
			}
		})
		b.Run("bf16/m="+strconv.Itoa(m), func(b *testing.B) {
			b.SetBytes(int64(n * k * 2))
			for range b.N {
				SgemmBF16(false, true, m, n, k, 1, a[:m*k], k, bh, k, 0, c, n)
			}
		})
	}
}
