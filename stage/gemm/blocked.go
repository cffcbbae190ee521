package gemm

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// job is one blocked Sgemm shared by its worker goroutines. Every worker
// walks the same jc/pc loop nest, so the block bounds need no sharing; only
// the work counters and the packed B block are shared, and two barriers per
// block keep the phases apart: all of B̃ is packed before any kernel reads
// it, and every kernel is done before B̃ is overwritten.
type job struct {
	kr      *microKernel
	g       *args
	threads int
	kc, nc  int
	mTiles  int
	mBlocks int // row blocks, each packed once into a worker's Ã buffer
	aLen    int // Ã buffer length per worker
	bbuf    []float32

	nextB, nextC atomic.Int64 // next B panel chunk / compute task to take
	bar          barrier
}

// bPackChunk panels of B are packed per grab of the counter: large enough
// that the counter is not contended, small enough to share the work evenly.
const bPackChunk = 4

var jobPool = sync.Pool{New: func() any { return new(job) }}

func blocked(kr *microKernel, threads int, g *args) {
	j := jobPool.Get().(*job)
	*j = job{kr: kr, g: g, threads: threads}
	j.kc = balance(g.k, kr.kc, 1)
	j.nc = balance(g.n, kr.nc, kr.nr)
	j.mTiles = ceilDiv(g.m, kr.mr)
	// Row blocks of at most mc rows, and a multiple of the worker count so
	// that equal-speed workers finish together; the dynamic counter then
	// evens out a worker that the OS preempts.
	j.mBlocks = ceilDiv(j.mTiles, kr.mc/kr.mr)
	if threads > 1 {
		j.mBlocks = min(roundUp(j.mBlocks, threads), j.mTiles)
	}
	j.aLen = ceilDiv(j.mTiles, j.mBlocks) * kr.mr * j.kc
	bb := getBuf(j.kc * roundUp(j.nc, kr.nr))
	j.bbuf = bb.f
	j.bar.init(threads)

	if threads == 1 {
		j.work()
	} else {
		var wg sync.WaitGroup
		wg.Add(threads - 1)
		for range threads - 1 {
			go func() {
				defer wg.Done()
				j.work()
			}()
		}
		j.work()
		wg.Wait()
	}
	putBuf(bb)
	*j = job{}
	jobPool.Put(j)
}

func (j *job) work() {
	g, kr := j.g, j.kr
	ab := getBuf(j.aLen + kr.mr*kr.nr)
	abuf, tmp := ab.f[:j.aLen], ab.f[j.aLen:]
	for jc := 0; jc < g.n; jc += j.nc {
		ncur := min(j.nc, g.n-jc)
		nPanels := ceilDiv(ncur, kr.nr)
		// When there are fewer row blocks than workers, split the columns too.
		nSplit := 1
		if j.mBlocks < j.threads {
			nSplit = min(nPanels, ceilDiv(j.threads, j.mBlocks))
		}
		tasks := j.mBlocks * nSplit
		for pc := 0; pc < g.k; pc += j.kc {
			kcur := min(j.kc, g.k-pc)
			beta := g.beta
			if pc > 0 {
				beta = 1 // later k blocks accumulate onto the first
			}
			for {
				lo := int(j.nextB.Add(bPackChunk)) - bPackChunk
				if lo >= nPanels {
					break
				}
				packB(j.bbuf, kr.nr, g, pc, kcur, jc, ncur, lo, min(lo+bPackChunk, nPanels))
			}
			j.bar.wait(&j.nextC)
			for {
				t := int(j.nextC.Add(1)) - 1
				if t >= tasks {
					break
				}
				ib, jb := t/nSplit, t%nSplit
				j.compute(abuf, tmp, ib, jc, ncur, jb*nPanels/nSplit, (jb+1)*nPanels/nSplit, pc, kcur, beta)
			}
			j.bar.wait(&j.nextB)
		}
	}
	putBuf(ab)
}

// compute packs row block ib of A and runs the kernel over B̃ panels
// [p0, p1) of the current block.
func (j *job) compute(abuf, tmp []float32, ib, jc, ncur, p0, p1, pc, kcur int, beta float32) {
	g, kr := j.g, j.kr
	mr, nr := kr.mr, kr.nr
	t0, t1 := ib*j.mTiles/j.mBlocks, (ib+1)*j.mTiles/j.mBlocks
	i0 := t0 * mr
	mcur := min(t1*mr, g.m) - i0
	packA(abuf, mr, g, i0, mcur, pc, kcur)
	for p := p0; p < p1; p++ {
		bp := &j.bbuf[p*nr*kcur]
		col := jc + p*nr
		nrCur := min(nr, jc+ncur-col)
		for it := 0; it < t1-t0; it++ {
			ap := &abuf[it*mr*kcur]
			row := i0 + it*mr
			mrCur := min(mr, g.m-row)
			if mrCur == mr && nrCur == nr {
				kr.run(kcur, ap, bp, &g.c[row*g.ldc+col], g.ldc, g.alpha, beta)
				continue
			}
			// Edge tile: compute the whole tile into tmp, copy the valid part.
			kr.run(kcur, ap, bp, &tmp[0], nr, g.alpha, 0)
			mergeTile(g, tmp, nr, row, col, mrCur, nrCur, beta)
		}
	}
}

// packA copies rows [i0, i0+mcur) and columns [pc, pc+kcur) of op(A) into
// dst as panels of mr rows, each k-major (mr values per step of k), padding
// the last panel with zeros.
func packA(dst []float32, mr int, g *args, i0, mcur, pc, kcur int) {
	for ip := 0; ip < mcur; ip += mr {
		rows := min(mr, mcur-ip)
		panel := dst[ip*kcur : (ip+mr)*kcur]
		if g.transA {
			// A is stored k×m: a step of k is a contiguous run of rows.
			for q := 0; q < kcur; q++ {
				off := (pc+q)*g.lda + i0 + ip
				d := panel[q*mr : q*mr+mr]
				copy(d, g.a[off:off+rows])
				clear(d[rows:])
			}
			continue
		}
		gatherT(panel, mr, g.a, g.lda, i0+ip, pc, rows, kcur)
	}
}

// packB copies panels [p0, p1) (nr columns each) of op(B) rows
// [pc, pc+kcur) and columns [jc, jc+ncur) into dst, k-major within a panel.
func packB(dst []float32, nr int, g *args, pc, kcur, jc, ncur, p0, p1 int) {
	if g.transB {
		// B is stored n×k: column col+x of op(B) is row col+x of b.
		for p := p0; p < p1; p++ {
			col := jc + p*nr
			gatherT(dst[p*nr*kcur:(p+1)*nr*kcur], nr, g.b, g.ldb, col, pc, min(nr, jc+ncur-col), kcur)
		}
		return
	}
	// Walk B row by row so that reads are long sequential runs; each row
	// scatters into the panels' next k step.
	full := p1
	if last := jc + p1*nr; last > jc+ncur {
		full = p1 - 1 // the last panel is partial
	}
	for q := 0; q < kcur; q++ {
		row := g.b[(pc+q)*g.ldb+jc : (pc+q)*g.ldb+jc+ncur]
		switch nr {
		case 16:
			for p := p0; p < full; p++ {
				*(*[16]float32)(dst[(p*kcur+q)*16:]) = *(*[16]float32)(row[p*16:])
			}
		case 4:
			for p := p0; p < full; p++ {
				*(*[4]float32)(dst[(p*kcur+q)*4:]) = *(*[4]float32)(row[p*4:])
			}
		case 32:
			for p := p0; p < full; p++ {
				*(*[32]float32)(dst[(p*kcur+q)*32:]) = *(*[32]float32)(row[p*32:])
			}
		default:
			for p := p0; p < full; p++ {
				copy(dst[(p*kcur+q)*nr:(p*kcur+q+1)*nr], row[p*nr:])
			}
		}
		if full < p1 {
			d := dst[(full*kcur+q)*nr : (full*kcur+q+1)*nr]
			w := copy(d, row[full*nr:])
			clear(d[w:])
		}
	}
}

// gatherT transposes rows [r0, r0+rows) × columns [c0, c0+kcur) of src
// into dst with dst[q*width+r] = src[(r0+r)*ld+c0+q], zero for r ≥ rows.
// This is the packing cost of non-transposed A and transposed B, so it is
// written for speed: rows go in groups of 4, 2 and 1, each group reading
// its rows as sequential streams and writing adjacent values per k step.
// (One value at a time per row, the obvious loop, was three times slower;
// groups of 8 were slower than 4.)
func gatherT(dst []float32, width int, src []float32, ld, r0, c0, rows, kcur int) {
	dst = dst[:width*kcur]
	if rows < width {
		clear(dst)
	}
	if kcur == 0 {
		return
	}
	// The bounds of every store below: q < kcur and r+group ≤ rows ≤ width
	// keep q*width+r+group-1 < width*kcur = len(dst).
	base := unsafe.Pointer(unsafe.SliceData(dst))
	at := func(q, r int) unsafe.Pointer { return unsafe.Add(base, 4*(q*width+r)) }
	row := func(r int) []float32 {
		off := (r0+r)*ld + c0
		return src[off : off+kcur : off+kcur]
	}
	r := 0
	for ; r+4 <= rows; r += 4 {
		s0, s1, s2, s3 := row(r), row(r+1), row(r+2), row(r+3)
		s1, s2, s3 = s1[:len(s0)], s2[:len(s0)], s3[:len(s0)]
		for q := range s0 {
			*(*[4]float32)(at(q, r)) = [4]float32{s0[q], s1[q], s2[q], s3[q]}
		}
	}
	if r+2 <= rows {
		s0, s1 := row(r), row(r+1)
		s1 = s1[:len(s0)]
		for q := range s0 {
			*(*[2]float32)(at(q, r)) = [2]float32{s0[q], s1[q]}
		}
		r += 2
	}
	if r < rows {
		for q, v := range row(r) {
			*(*float32)(at(q, r)) = v
		}
	}
}

// barrier lets n workers wait for each other. The last to arrive resets
// the counter of the next phase before releasing the rest. Waiters spin a
// little first: the other worker is usually microseconds away, and parking
// the thread would cost more than that.
type barrier struct {
	n       int32
	arrived atomic.Int32
	gen     atomic.Uint32
	mu      sync.Mutex
	cond    sync.Cond
}

const barrierSpins = 20000

func (b *barrier) init(n int) {
	b.n = int32(n)
	b.cond.L = &b.mu
}

func (b *barrier) wait(reset *atomic.Int64) {
	if b.n == 1 {
		reset.Store(0)
		return
	}
	gen := b.gen.Load()
	if b.arrived.Add(1) == b.n {
		b.arrived.Store(0)
		reset.Store(0)
		b.mu.Lock()
		b.gen.Add(1)
		b.cond.Broadcast()
		b.mu.Unlock()
		return
	}
	for range barrierSpins {
		if b.gen.Load() != gen {
			return
		}
	}
	b.mu.Lock()
	for b.gen.Load() == gen {
		b.cond.Wait()
	}
	b.mu.Unlock()
}

// buf is a pooled float32 buffer whose f starts on a 64-byte boundary, so
// packed panels line up with cache lines and zmm loads never split one.
type buf struct {
	raw []float32
	f   []float32
}

var bufPool sync.Pool

func getBuf(n int) *buf {
	b, _ := bufPool.Get().(*buf)
	if b == nil {
		b = new(buf)
	}
	if cap(b.raw) < n+16 {
		b.raw = make([]float32, n+16)
	}
	off := 0
	if mis := uintptr(unsafe.Pointer(unsafe.SliceData(b.raw))) % 64; mis != 0 {
		off = int(64-mis) / 4
	}
	b.f = b.raw[off : off+n]
	return b
}

func putBuf(b *buf) {
	b.f = nil
	bufPool.Put(b)
}
