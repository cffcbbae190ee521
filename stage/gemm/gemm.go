// Package gemm is holopeer's single-precision matrix multiply on the CPU.
//
// Sgemm is the one entry point; it follows BLAS conventions on row-major
// storage so that callers (the cpu backend, benchmarks) can compare it with
// gonum's blas32 directly.
//
// The implementation is the classic packed, blocked scheme (Goto/BLIS): for
// each kc-deep slice of k and nc-wide slice of n, B is copied into panels
// nr columns wide and A into panels mr rows tall, so the micro-kernel reads
// both sequentially from cache whatever the transposes and strides were. The
// micro-kernel is Go assembly for AVX-512 or AVX2+FMA chosen at run time, or
// portable Go. Packing and the kernel calls are shared between GOMAXPROCS
// goroutines; small products run on the calling goroutine alone.
package gemm

import (
	"fmt"
	"runtime"
)

// Sgemm computes C = alpha·op(A)·op(B) + beta·C on row-major matrices, where
// op(X) is X or Xᵀ. op(A) is m×k, op(B) is k×n and C is m×n; lda, ldb and
// ldc are the row strides of A, B and C as stored. When beta is zero C is
// only written, so it may hold anything (NaN included) beforehand.
//
// Like BLAS, it panics on negative sizes, strides shorter than a row, or
// slices too short for the shapes given.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("gemm: negative size m=%d n=%d k=%d", m, n, k))
	}
	checkMatrix("a", a, ar, ac, lda)
	checkMatrix("b", b, br, bc, ldb)
	checkMatrix("c", c, m, n, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleC(m, n, beta, c, ldc)
		return
	}
	g := args{transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc}
	if int64(m)*int64(n)*int64(k) <= directMaxWork {
		direct(&g)
		return
	}
	kr := activeKernel()
	if g.m <= kr.mr && !g.transB && kr.runB != nil {
		rowPanel(kr, threadsFor(kr, &g), &g)
		return
	}
	blocked(kr, threadsFor(kr, &g), &g)
}

// directMaxWork is the product m·n·k under which packing costs more than it
// saves and a plain triple loop is used.
const directMaxWork = 8 * 8 * 8

// minWorkPerThread is the m·n·k below which another goroutine does not pay
// for its start-up and the barriers (a few microseconds each).
const minWorkPerThread = 1 << 20

// threadsOverride, when positive, fixes the goroutine count (tests use it to
// exercise the partitioning with more workers than cores).
var threadsOverride int

func threadsFor(kr *microKernel, g *args) int {
	if threadsOverride > 0 {
		return threadsOverride
	}
	t := runtime.GOMAXPROCS(0)
	if w := int64(g.m) * int64(g.n) * int64(g.k) / minWorkPerThread; w < int64(t) {
		t = max(int(w), 1)
	}
	// No more workers than there are micro-tiles to hand out.
	if tiles := ceilDiv(g.m, kr.mr) * ceilDiv(g.n, kr.nr); tiles < t {
		t = max(tiles, 1)
	}
	return t
}

type args struct {
	transA, transB bool
	m, n, k        int
	alpha          float32
	a              []float32
	lda            int
	b              []float32
	ldb            int
	beta           float32
	c              []float32
	ldc            int
}

func checkMatrix(name string, x []float32, rows, cols, ld int) {
	if ld < max(cols, 1) {
		panic(fmt.Sprintf("gemm: ld%s=%d shorter than a row of %d", name, ld, cols))
	}
	if rows > 0 && cols > 0 && len(x) < (rows-1)*ld+cols {
		panic(fmt.Sprintf("gemm: %s has %d elements, %d×%d with stride %d needs %d", name, len(x), rows, cols, ld, (rows-1)*ld+cols))
	}
}

// scaleC sets C = beta·C, writing zeros without reading when beta is 0.
func scaleC(m, n int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		switch beta {
		case 0:
			clear(row)
		case 1:
		default:
			for j := range row {
				row[j] *= beta
			}
		}
	}
}

// direct is the unpacked triple loop for tiny products.
func direct(g *args) {
	for i := 0; i < g.m; i++ {
		crow := g.c[i*g.ldc : i*g.ldc+g.n]
		for j := range crow {
			var s float32
			for p := 0; p < g.k; p++ {
				var av, bv float32
				if g.transA {
					av = g.a[p*g.lda+i]
				} else {
					av = g.a[i*g.lda+p]
				}
				if g.transB {
					bv = g.b[j*g.ldb+p]
				} else {
					bv = g.b[p*g.ldb+j]
				}
				s += av * bv
			}
			if g.beta == 0 {
				crow[j] = g.alpha * s
			} else {
				crow[j] = g.alpha*s + g.beta*crow[j]
			}
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func roundUp(a, b int) int { return ceilDiv(a, b) * b }

// balance splits total into ceil(total/limit) near-equal parts and returns
// the part size rounded up to a multiple of unit, so that a k of 300 becomes
// two blocks of 152 rather than 256 and 44.
func balance(total, limit, unit int) int {
	if total <= limit {
		return roundUp(total, unit)
	}
	parts := ceilDiv(total, limit)
	return roundUp(ceilDiv(total, parts), unit)
}
