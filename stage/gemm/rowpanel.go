package gemm

import (
	"sync"
	"sync/atomic"
)

const (
	// rowPanelCols columns (a 4 KiB run of each B row) are at most one unit
	// of work; fewer when that would leave a worker idle.
	rowPanelCols = 1024
	// rowPanelKC rows of B are walked per pass over a chunk. B rows are
	// often many KiB apart, so every row is a new page: a pass touches only
	// this many pages, which the TLB holds while the chunk's panels take
	// their turns. (Measured at m=1, n=4096, k=1024 on Zen 3: 1024 columns
	// by 64 rows ran 40% faster than 256 by 256.)
	rowPanelKC = 64
)

// rowPanel handles products whose op(A) fits in one micro-panel (m ≤ mr)
// and whose B is not transposed, such as a single token's activations
// times a weight matrix. Each element of B is used once, so packing B
// would only add a copy; instead A is packed once and the kernel reads B
// in place (runB). Workers share out chunks of nr-wide column panels.
func rowPanel(kr *microKernel, threads int, g *args) {
	ab := getBuf(kr.mr * g.k)
	packA(ab.f, kr.mr, g, 0, g.m, 0, g.k)
	nPanels := ceilDiv(g.n, kr.nr)
	chunk := max(1, min(rowPanelCols/kr.nr, ceilDiv(nPanels, 2*threads)))

	var next atomic.Int64
	work := func() {
		sb := getBuf(kr.mr*chunk*kr.nr + rowPanelKC*kr.nr)
		for {
			lo := int(next.Add(int64(chunk))) - chunk
			if lo >= nPanels {
				break
			}
			rowPanelChunkRun(kr, g, ab.f, sb.f, lo, min(lo+chunk, nPanels))
		}
		putBuf(sb)
	}
	if threads == 1 {
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
	putBuf(ab)
}

// rowPanelChunkRun computes C[:, lo·nr : hi·nr] into an mr×(hi-lo)·nr
// scratch tile, k block by k block, and then merges the m valid rows into
// C once, so that rows past m and columns past n are never written.
func rowPanelChunkRun(kr *microKernel, g *args, abuf, scratch []float32, lo, hi int) {
	mr, nr := kr.mr, kr.nr
	ldt := (hi - lo) * nr
	tmp, edge := scratch[:mr*ldt], scratch[len(scratch)-rowPanelKC*nr:]
	for pc := 0; pc < g.k; pc += rowPanelKC {
		kcur := min(rowPanelKC, g.k-pc)
		var beta float32 // first k block overwrites tmp, later ones add
		if pc > 0 {
			beta = 1
		}
		ap := &abuf[pc*mr]
		for p := lo; p < hi; p++ {
			col := p * nr
			c := &tmp[(p-lo)*nr]
			if w := min(nr, g.n-col); w < nr {
				// The last, partial panel: B has no nr columns to read here.
				packB(edge, nr, g, pc, kcur, col, w, 0, 1)
				kr.run(kcur, ap, &edge[0], c, ldt, g.alpha, beta)
				continue
			}
			kr.runB(kcur, ap, &g.b[pc*g.ldb+col], c, ldt, g.alpha, beta, g.ldb)
		}
	}
	mergeTile(g, tmp, ldt, 0, lo*nr, g.m, min(hi*nr, g.n)-lo*nr, g.beta)
}

// mergeTile adds a rows×cols tile computed into tmp (row stride ldt) to C
// at (row, col): C = tmp + beta·C, without reading C when beta is 0.
func mergeTile(g *args, tmp []float32, ldt, row, col, rows, cols int, beta float32) {
	for r := 0; r < rows; r++ {
		src := tmp[r*ldt : r*ldt+cols]
		dst := g.c[(row+r)*g.ldc+col : (row+r)*g.ldc+col+cols]
		if beta == 0 {
			copy(dst, src)
			continue
		}
		for x, v := range src {
			dst[x] = v + beta*dst[x]
		}
	}
}
