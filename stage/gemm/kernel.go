package gemm

import (
	"math"
	"slices"
)

// microKernel is one register-tiled inner kernel together with the cache
// blocking that suits it. run computes
//
//	C[0:mr, 0:nr] = alpha·Ã·B̃ + beta·C
//
// over k steps, where Ã is a packed mr×k panel (mr values per step of k), B̃
// a packed k×nr panel (nr values per step of k), and rows of C are ldc
// elements apart. beta == 0 must write C without reading it.
type microKernel struct {
	name   string
	mr, nr int
	// kc, mc and nc are the depth of a packed block, the rows of A packed
	// at once (kept in L2) and the columns of B packed at once (kept in L3).
	kc, mc, nc int
	run        func(k int, a, b, c *float32, ldc int, alpha, beta float32)
	// runB, where not nil, is run reading B in place: row q of the k×nr
	// panel is at b + q·ldb. Sgemm uses it when op(A) has at most mr rows,
	// where B would be packed only to be read once.
	runB func(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)
	// dot4, where not nil, sets out[j] = Σ_{q<k} a[q]·b[j·ldb+q] for
	// j < 4 with k a multiple of 8. Sgemm uses it for op(A)·Bᵀ when op(A)
	// has a few rows, where B's rows are contiguous and read once.
	dot4 func(k int, a, b *float32, ldb int, out *float32)
}

// avx512Geometry and avx2Geometry are the tiles and blocking of the x86
// assembly kernels. They are defined on every platform so that tests can
// drive the blocked code with these exact shapes using a Go kernel.
var (
	avx512Geometry = microKernel{name: "avx512", mr: 14, nr: 32, kc: 256, mc: 168, nc: 4096}
	avx2Geometry   = microKernel{name: "avx2", mr: 6, nr: 16, kc: 256, mc: 144, nc: 4096}
)

// kernels lists the kernels this machine can run, fastest first; the
// generic kernel is always last. Filled by init in the arch files.
var kernels []*microKernel

// kernelOverride, when set, replaces the automatic choice (tests use it to
// run every kernel on one machine).
var kernelOverride *microKernel

func activeKernel() *microKernel {
	if kernelOverride != nil {
		return kernelOverride
	}
	return kernels[0]
}

// Kernel names the micro-kernel Sgemm uses on this machine: "avx512",
// "avx2" or "generic". Status and capability records report it.
func Kernel() string { return activeKernel().name }

// kernelWorks runs kr once on a small exactly representable problem and
// compares it with plain Go arithmetic. Assembly kernels are checked this
// way before first use, so that a kernel miscompiled for a CPU the project
// never ran on is dropped rather than trusted: holopeer trains on whatever
// machines join the swarm.
func kernelWorks(kr *microKernel) bool {
	const k = 9 // odd: exercises an unrolled loop's tail
	mr, nr := kr.mr, kr.nr
	ldc := nr + 3
	a := make([]float32, mr*k)
	b := make([]float32, k*nr)
	for i := range a {
		a[i] = float32(i%5 - 2)
	}
	for i := range b {
		b[i] = float32(i%7 - 3)
	}
	nan := float32(math.NaN())
	// The same B panel inside a wider row-major matrix, for runB; the
	// column past the panel is NaN and must not be read.
	ldb := nr + 5
	wide := make([]float32, k*ldb)
	for q := 0; q < k; q++ {
		copy(wide[q*ldb:], b[q*nr:(q+1)*nr])
		wide[q*ldb+nr] = nan
	}
	// matches checks c, which held old before the kernel ran.
	matches := func(c, old []float32, beta float32) bool {
		for r := 0; r < mr; r++ {
			for x := 0; x < ldc; x++ {
				got := c[r*ldc+x]
				if x >= nr {
					// Outside the tile: must be untouched.
					if math.Float32bits(got) != math.Float32bits(old[r*ldc+x]) {
						return false
					}
					continue
				}
				var s float32
				for p := 0; p < k; p++ {
					s += a[p*mr+r] * b[p*nr+x]
				}
				want := 2 * s
				if beta != 0 {
					want += beta * old[r*ldc+x]
				}
				if got != want {
					return false
				}
			}
		}
		return true
	}
	if kr.dot4 != nil {
		// Four rows of wide (ldb apart) against the first 8 values of a.
		var out [4]float32
		kr.dot4(8, &a[0], &wide[0], ldb, &out[0])
		for j := range out {
			var s float32
			for q := 0; q < 8; q++ {
				s += a[q] * wide[j*ldb+q]
			}
			if out[j] != s {
				return false
			}
		}
	}
	c := make([]float32, mr*ldc)
	for _, beta := range []float32{0, 0.5} {
		for i := range c {
			c[i] = float32(i % 3)
			if beta == 0 {
				c[i] = nan
			}
		}
		old := slices.Clone(c)
		kr.run(k, &a[0], &b[0], &c[0], ldc, 2, beta)
		if !matches(c, old, beta) {
			return false
		}
		if kr.runB != nil {
			copy(c, old)
			kr.runB(k, &a[0], &wide[0], &c[0], ldc, 2, beta, ldb)
			if !matches(c, old, beta) {
				return false
			}
		}
	}
	return true
}
