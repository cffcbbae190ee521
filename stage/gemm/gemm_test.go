package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// refGemm is the float64 oracle: C = alpha·op(A)·op(B) + beta·C, with
// beta == 0 ignoring C. It also returns, per element, the sum of the
// magnitudes of the terms, which bounds the float32 rounding error.
func refGemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) (want, mag []float64) {
	want = make([]float64, m*n)
	mag = make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, sa float64
			for p := 0; p < k; p++ {
				var av, bv float64
				if transA {
					av = float64(a[p*lda+i])
				} else {
					av = float64(a[i*lda+p])
				}
				if transB {
					bv = float64(b[j*ldb+p])
				} else {
					bv = float64(b[p*ldb+j])
				}
				s += av * bv
				sa += math.Abs(av * bv)
			}
			w := float64(alpha) * s
			ma := math.Abs(float64(alpha)) * sa
			if beta != 0 {
				old := float64(c[i*ldc+j])
				w += float64(beta) * old
				ma += math.Abs(float64(beta) * old)
			}
			want[i*n+j], mag[i*n+j] = w, ma
		}
	}
	return want, mag
}

type gemmCase struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	padA, padB     int // extra stride beyond the row length
	padC           int
}

func (tc gemmCase) String() string {
	return fmt.Sprintf("tA=%v tB=%v m=%d n=%d k=%d alpha=%g beta=%g pad=%d/%d/%d",
		tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, tc.beta, tc.padA, tc.padB, tc.padC)
}

// check runs Sgemm on random data for tc and compares with the oracle. C's
// padding columns hold a sentinel that must survive, and when beta is zero
// C starts as NaN, which must not leak into the result.
func check(t testing.TB, rng *rand.Rand, tc gemmCase) {
	t.Helper()
	ar, ac := tc.m, tc.k
	if tc.transA {
		ar, ac = tc.k, tc.m
	}
	br, bc := tc.k, tc.n
	if tc.transB {
		br, bc = tc.n, tc.k
	}
	lda, ldb, ldc := max(ac, 1)+tc.padA, max(bc, 1)+tc.padB, max(tc.n, 1)+tc.padC
	fill := func(rows, ld int) []float32 {
		x := make([]float32, rows*ld)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return x
	}
	a, b := fill(ar, lda), fill(br, ldb)
	c := fill(tc.m, ldc)
	const sentinel = 12345.5
	for i := 0; i < tc.m; i++ {
		for j := 0; j < ldc; j++ {
			switch {
			case j >= tc.n:
				c[i*ldc+j] = sentinel
			case tc.beta == 0:
				c[i*ldc+j] = float32(math.NaN())
			}
		}
	}
	want, mag := refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	Sgemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	// float32 accumulation over k terms: error ≤ about k·ε·Σ|terms|; the
	// kernels add in blocks, which only makes it smaller.
	tol := float64(tc.k+4) * 1.2e-7
	for i := 0; i < tc.m; i++ {
		for j := 0; j < ldc; j++ {
			got := c[i*ldc+j]
			if j >= tc.n {
				if got != sentinel {
					t.Fatalf("%v: wrote C[%d][%d] outside n (stride padding): %g", tc, i, j, got)
				}
				continue
			}
			w, ma := want[i*tc.n+j], mag[i*tc.n+j]
			if d := math.Abs(float64(got) - w); !(d <= tol*ma+1e-30) {
				t.Fatalf("%v: C[%d][%d] = %g, want %g (diff %g, bound %g)", tc, i, j, got, w, d, tol*ma)
			}
		}
	}
}

// withKernel runs f with kr forced as the kernel and, when threads > 0, a
// fixed worker count.
func withKernel(kr *microKernel, threads int, f func()) {
	oldK, oldT := kernelOverride, threadsOverride
	kernelOverride, threadsOverride = kr, threads
	defer func() { kernelOverride, threadsOverride = oldK, oldT }()
	f()
}

// tinyBlocked is kr with blocks so small that modest shapes cross every
// kc, mc and nc boundary, to test the block loops cheaply.
func tinyBlocked(kr *microKernel) *microKernel {
	t := *kr
	t.kc, t.mc, t.nc = 5, 2*kr.mr, 3*kr.nr
	return &t
}

// interesting sizes for a kernel: around 1, around its tile sizes, and odd.
func sizesFor(kr *microKernel) []int {
	return []int{1, 2, 3, kr.mr - 1, kr.mr, kr.mr + 1, kr.nr - 1, kr.nr, kr.nr + 1, 2*kr.mr + 3, 5*kr.mr + 1, 2*kr.nr + 5, 3*kr.nr + 7, 37}
}

// testKernels is every kernel this machine can run, plus the portable
// kernel of the other register-file size, so that both are tested here.
func testKernels() []*microKernel {
	ks := append([]*microKernel(nil), kernels...)
	if genericKernel == generic2x4 {
		ks = append(ks, generic4x4)
	} else {
		ks = append(ks, generic2x4)
	}
	return append(ks, geometryKernel(&avx512Geometry), geometryKernel(&avx2Geometry))
}

// geometryKernel is a plain-Go kernel with the tile and blocking of kr,
// including a runB: it lets this machine test the driver with the exact
// geometry of a kernel it cannot run (AVX-512's 14×32 on a CPU without
// AVX-512); the assembly itself is checked by kernelWorks on such CPUs.
func geometryKernel(kr *microKernel) *microKernel {
	g := *kr
	g.name = kr.name + "-geometry"
	mr, nr := kr.mr, kr.nr
	g.runB = func(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int) {
		as := unsafe.Slice(a, mr*k)
		bs := unsafe.Slice(b, (k-1)*ldb+nr)
		cs := unsafe.Slice(c, (mr-1)*ldc+nr)
		for r := 0; r < mr; r++ {
			for x := 0; x < nr; x++ {
				var s float32
				for q := 0; q < k; q++ {
					s += as[q*mr+r] * bs[q*ldb+x]
				}
				if beta == 0 {
					cs[r*ldc+x] = alpha * s
				} else {
					cs[r*ldc+x] = alpha*s + beta*cs[r*ldc+x]
				}
			}
		}
	}
	g.run = func(k int, a, b, c *float32, ldc int, alpha, beta float32) {
		g.runB(k, a, b, c, ldc, alpha, beta, nr)
	}
	return &g
}

func kernelLabel(kr *microKernel) string { return fmt.Sprintf("%s_%dx%d", kr.name, kr.mr, kr.nr) }

func TestSgemmEveryKernel(t *testing.T) {
	for _, kr := range testKernels() {
		t.Run(kernelLabel(kr), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(kr.name))))
			sizes := sizesFor(kr)
			for _, threads := range []int{1, 2, 3} {
				for _, blk := range []*microKernel{kr, tinyBlocked(kr)} {
					withKernel(blk, threads, func() {
						for trans := range 4 {
							for range 20 {
								tc := gemmCase{
									transA: trans&1 != 0, transB: trans&2 != 0,
									m: sizes[rng.IntN(len(sizes))], n: sizes[rng.IntN(len(sizes))], k: sizes[rng.IntN(len(sizes))],
									alpha: []float32{1, -0.5, 2.25}[rng.IntN(3)],
									beta:  []float32{0, 1, -1.5}[rng.IntN(3)],
									padA:  rng.IntN(3), padB: rng.IntN(3), padC: rng.IntN(3),
								}
								check(t, rng, tc)
							}
						}
					})
				}
			}
		})
	}
}

// TestSgemmModelShapes covers the shapes the transformer stages use, with
// each kernel's real blocking and every transpose.
func TestSgemmModelShapes(t *testing.T) {
	// m ≤ mr with B not transposed takes the row-panel path: {1,1000,700}
	// and {6,530,600} cross its k blocks, column chunks and partial panel.
	shapes := [][3]int{{64, 8, 256}, {64, 256, 8}, {128, 96, 64}, {1, 300, 70}, {300, 1, 70}, {100, 100, 1}, {97, 130, 600}, {1, 1000, 700}, {6, 530, 600}, {14, 530, 300}}
	for _, kr := range testKernels() {
		t.Run(kernelLabel(kr), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(2, 0))
			withKernel(kr, 0, func() {
				for _, s := range shapes {
					for trans := range 4 {
						check(t, rng, gemmCase{transA: trans&1 != 0, transB: trans&2 != 0, m: s[0], n: s[1], k: s[2], alpha: 1, beta: float32(trans%2) * 0.5, padC: trans})
					}
				}
			})
		})
	}
}

// TestSgemmLarge crosses the real kc and the row-block split with the
// default kernel on all cores.
func TestSgemmLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large product")
	}
	rng := rand.New(rand.NewPCG(3, 0))
	for trans := range 4 {
		check(t, rng, gemmCase{transA: trans&1 != 0, transB: trans&2 != 0, m: 301, n: 259, k: 531, alpha: 1.5, beta: 0.25, padA: 1, padB: 2, padC: 3})
	}
}

func TestSgemmDegenerate(t *testing.T) {
	nan := float32(math.NaN())
	// k == 0 and alpha == 0: C = beta·C, and beta == 0 clears NaN.
	for _, tc := range []struct {
		k     int
		alpha float32
		beta  float32
		want  float32
	}{{0, 1, 0, 0}, {0, 1, 2, 6}, {4, 0, 0, 0}, {4, 0, -1, -3}} {
		c := []float32{3, 3, 3, 3}
		if tc.beta == 0 {
			c = []float32{nan, nan, nan, nan}
		}
		a := make([]float32, 2*max(tc.k, 1))
		b := make([]float32, max(tc.k, 1)*2)
		Sgemm(false, false, 2, 2, tc.k, tc.alpha, a, max(tc.k, 1), b, 2, tc.beta, c, 2)
		for i, v := range c {
			if v != tc.want {
				t.Fatalf("k=%d alpha=%g beta=%g: c[%d] = %g, want %g", tc.k, tc.alpha, tc.beta, i, v, tc.want)
			}
		}
	}
	// m == 0 or n == 0 touch nothing, even with nil slices.
	Sgemm(false, false, 0, 5, 5, 1, nil, 5, make([]float32, 25), 5, 0, nil, 5)
	Sgemm(true, true, 5, 0, 5, 1, make([]float32, 25), 5, nil, 5, 0, nil, 1)
}

func TestSgemmPanicsOnBadArguments(t *testing.T) {
	for name, f := range map[string]func(){
		"negative m": func() { Sgemm(false, false, -1, 1, 1, 1, nil, 1, nil, 1, 0, nil, 1) },
		"short lda": func() {
			Sgemm(false, false, 2, 2, 3, 1, make([]float32, 6), 2, make([]float32, 6), 2, 0, make([]float32, 4), 2)
		},
		"short a": func() {
			Sgemm(false, false, 2, 2, 3, 1, make([]float32, 5), 3, make([]float32, 6), 2, 0, make([]float32, 4), 2)
		},
		"short c": func() {
			Sgemm(false, false, 2, 2, 3, 1, make([]float32, 6), 3, make([]float32, 6), 2, 0, make([]float32, 3), 2)
		},
		"short b trans": func() {
			Sgemm(false, true, 2, 2, 3, 1, make([]float32, 6), 3, make([]float32, 5), 3, 0, make([]float32, 4), 2)
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

// TestKernelsPassSelfCheck makes sure every kernel this machine runs passes
// the start-up check, and that the check catches a wrong kernel.
func TestKernelsPassSelfCheck(t *testing.T) {
	for _, kr := range testKernels() {
		if !kernelWorks(kr) {
			t.Errorf("%s fails its self-check", kr.name)
		}
	}
	broken := *genericKernel
	broken.run = func(k int, a, b, c *float32, ldc int, alpha, beta float32) {
		genericKernel.run(k-1, a, b, c, ldc, alpha, beta) // drops the last k step
	}
	if kernelWorks(&broken) {
		t.Error("self-check accepted a kernel that drops a k step")
	}
	for _, kr := range kernels {
		if kr.runB == nil {
			continue
		}
		broken := *kr
		broken.runB = func(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int) {
			kr.runB(k, a, b, c, ldc, alpha, beta, ldb+1) // wrong row stride
		}
		if kernelWorks(&broken) {
			t.Errorf("self-check accepted %s with a wrong B stride", kr.name)
		}
	}
	if Kernel() == "" {
		t.Error("Kernel() is empty")
	}
	t.Logf("kernels on this machine: %v, in use: %s", kernelNames(), Kernel())
}

func kernelNames() []string {
	var s []string
	for _, kr := range kernels {
		s = append(s, kr.name)
	}
	return s
}

// FuzzSgemm checks random shapes, transposes, strides and scalars against
// the oracle with the kernel in use (and the generic one).
func FuzzSgemm(f *testing.F) {
	f.Add(uint8(64), uint8(8), uint8(255), uint8(0), uint64(1))
	f.Add(uint8(15), uint8(33), uint8(7), uint8(0xff), uint64(2))
	f.Add(uint8(1), uint8(1), uint8(1), uint8(0x5a), uint64(3))
	f.Fuzz(func(t *testing.T, m, n, k, flags uint8, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 0))
		tc := gemmCase{
			transA: flags&1 != 0, transB: flags&2 != 0,
			m: int(m % 80), n: int(n % 80), k: int(k),
			alpha: []float32{1, -2, 0.5, 0}[flags>>2&3],
			beta:  []float32{0, 1, -0.75, 0}[flags>>4&3],
			padA:  int(flags >> 6), padB: int(flags>>5) & 1, padC: int(flags>>3) & 3,
		}
		check(t, rng, tc)
		withKernel(tinyBlocked(genericKernel), 2, func() { check(t, rng, tc) })
	})
}

// TestSgemmConcurrentCalls runs products from several goroutines at once:
// stage pipelines call Sgemm concurrently, and the calls share pools.
func TestSgemmConcurrentCalls(t *testing.T) {
	done := make(chan error)
	for w := range 4 {
		go func() {
			defer func() {
				if r := recover(); r != nil {
					done <- fmt.Errorf("worker %d: %v", w, r)
					return
				}
				done <- nil
			}()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range 6 {
				check(panicTB{t}, rng, gemmCase{transA: i&1 != 0, transB: w&1 != 0, m: 40 + 7*w, n: 50 + 3*i, k: 90, alpha: 1, beta: 0.5})
				check(panicTB{t}, rng, gemmCase{m: 1 + w, n: 300, k: 80, alpha: 2})
			}
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// panicTB turns Fatalf into a panic so that check can run off the test
// goroutine (FailNow must not be called there).
type panicTB struct{ testing.TB }

func (p panicTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (p panicTB) Helper()                           {}
