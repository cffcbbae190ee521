package gemm

import (
	"sync"
	"sync/atomic"
)

// rowDotsMaxM is the most rows of op(A) that rowDots takes: each row reads
// a group of four B rows again, from L2, so a few rows cost little, and
// beyond that the blocked path's packing pays for itself.
const rowDotsMaxM = 4

// rowDotsChunk groups of four B rows are one unit of work.
const rowDotsChunk = 16

// rowDots computes op(A)·Bᵀ for a few rows of op(A) (one token times a
// weight matrix stored out×in): C[i][j] = alpha·⟨op(A)ᵢ, Bⱼ⟩ + beta·C[i][j].
// The rows of B are contiguous and each is read once, so dot products beat
// packing B (a transposing copy) for the blocked kernel.
func rowDots(kr *microKernel, threads int, g *args) {
	k := g.k
	// op(A)'s rows, contiguous.
	ab := getBuf(g.m * k)
	arows := ab.f
	for i := 0; i < g.m; i++ {
		if g.transA {
			for q := 0; q < k; q++ {
				arows[i*k+q] = g.a[q*g.lda+i]
			}
		} else {
			copy(arows[i*k:(i+1)*k], g.a[i*g.lda:i*g.lda+k])
		}
	}
	groups := g.n / 4
	var next atomic.Int64
	work := func() {
		for {
			lo := int(next.Add(rowDotsChunk)) - rowDotsChunk
			if lo >= groups {
				return
			}
			for grp := lo; grp < min(lo+rowDotsChunk, groups); grp++ {
				rowDotsGroup(kr, g, arows, grp*4)
			}
		}
	}
	if threads == 1 || groups < 2*rowDotsChunk {
		work()
	} else {
		var wg sync.WaitGroup
		wg.Add(threads - 1)
		for range threads - 1 {
			go func() {
				defer wg.Done()
				work()
			}()
		}
		work()
		wg.Wait()
	}
	// The last n%4 columns, one dot at a time.
	for j := groups * 4; j < g.n; j++ {
		brow := g.b[j*g.ldb : j*g.ldb+k]
		for i := 0; i < g.m; i++ {
			var s float32
			for q, v := range arows[i*k : (i+1)*k] {
				s += v * brow[q]
			}
			storeScaled(g, i, j, s)
		}
	}
	putBuf(ab)
}

// rowDotsGroup computes columns j0..j0+3 of every row of C.
func rowDotsGroup(kr *microKernel, g *args, arows []float32, j0 int) {
	k := g.k
	k8 := k &^ 7
	for i := 0; i < g.m; i++ {
		arow := arows[i*k : (i+1)*k]
		var out [4]float32
		if k8 > 0 {
			kr.dot4(k8, &arow[0], &g.b[j0*g.ldb], g.ldb, &out[0])
		}
		for j := range out {
			brow := g.b[(j0+j)*g.ldb : (j0+j)*g.ldb+k]
			for q := k8; q < k; q++ {
				out[j] += arow[q] * brow[q]
			}
			storeScaled(g, i, j0+j, out[j])
		}
	}
}

// storeScaled sets C[i][j] = alpha·s + beta·C[i][j], not reading C when
// beta is 0.
func storeScaled(g *args, i, j int, s float32) {
	c := &g.c[i*g.ldc+j]
	if g.beta == 0 {
		*c = g.alpha * s
	} else {
		*c = g.alpha*s + g.beta**c
	}
}
