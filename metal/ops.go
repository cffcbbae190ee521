//go:build (darwin && cgo && metal) || metalemu

package metal

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/holopeer/holopeer/stage/tensor"
)

// Launch geometry.
const (
	threads   = 256     // elementwise threadgroups
	maxGroups = 1 << 16 // threadgroups of a grid-stride loop
	maxElems  = math.MaxInt32
)

func i32(v int) int32 {
	if v < math.MinInt32 || v > math.MaxInt32 {
		panic(fmt.Sprintf("metal: kernel argument %d does not fit an int", v))
	}
	return int32(v)
}

func (be *Backend) dispatchLocked(k int, groups [3]int, tg int, bufs []bufRef, a *kernelArgs) {
	if err := be.drv.dispatch(k, groups, tg, bufs, a); err != nil {
		be.failLocked(kernelNames[k], err)
	}
}

// dispatch1DLocked queues a grid-stride kernel over n elements.
func (be *Backend) dispatch1DLocked(k, n int, bufs []bufRef, a *kernelArgs) {
	if n == 0 {
		return
	}
	tg := min(threads, be.drv.maxThreads(k)/simdWidth*simdWidth)
	be.dispatchLocked(k, [3]int{min(max((n+tg-1)/tg, 1), maxGroups), 1, 1}, tg, bufs, a)
}

func (be *Backend) dispatch1D(k, n int, bufs []bufRef, a *kernelArgs) {
	if n == 0 {
		return
	}
	defer be.lock()()
	be.dispatch1DLocked(k, n, bufs, a)
}

// rowThreads is the threadgroup size of a one-group-per-row kernel: whole
// SIMD groups covering width, at most 256.
func (be *Backend) rowThreads(k, width int) int {
	return min(max((width+simdWidth-1)/simdWidth*simdWidth, simdWidth), threads, be.drv.maxThreads(k)/simdWidth*simdWidth)
}

func (be *Backend) errRef() bufRef { return bufRef{be.errWord, 0} }

// readFloatsLocked waits for the queued work and returns n floats of h.
func (be *Backend) readFloatsLocked(h handle, n int) []float32 {
	be.flushLocked()
	out := make([]float32, n)
	be.drv.read(unsafe.Pointer(unsafe.SliceData(out)), h, 0, 4*int64(n))
	return out
}

// Gemm implements tensor.Backend with the tiled kernel hp_gemm.
func (be *Backend) Gemm(transA, transB bool, m, n, k int, alpha float32, a, b tensor.Buffer, beta float32, c tensor.Buffer) {
	ab, bb, cb := be.f32("Gemm", a), be.f32("Gemm", b), be.f32("Gemm", c)
	check.Gemm(m, n, k, ab.n, bb.n, cb.n)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 { // C = beta·C, and beta = 0 clears NaNs too, as BLAS does
		if beta == 0 {
			be.Fill(c, 0)
		} else {
			be.Scale(c, beta)
		}
		return
	}
	var ta, tb int32
	if transA {
		ta = 1
	}
	if transB {
		tb = 1
	}
	defer be.lock()()
	be.dispatchLocked(kernelGemm, [3]int{(n + gemmTile - 1) / gemmTile, (m + gemmTile - 1) / gemmTile, 1}, gemmThreads,
		[]bufRef{ab.ref(), bb.ref(), cb.ref()},
		&kernelArgs{i: [8]int32{i32(m), i32(n), i32(k), ta, tb}, f: [8]float32{alpha, beta}})
}

// Fill implements tensor.Backend.
func (be *Backend) Fill(x tensor.Buffer, v float32) {
	b := be.f32("Fill", x)
	be.dispatch1D(kernelFill, b.n, []bufRef{b.ref()}, &kernelArgs{i: [8]int32{i32(b.n)}, f: [8]float32{v}})
}

// Copy implements tensor.Backend.
func (be *Backend) Copy(dst, src tensor.Buffer) {
	d, s := be.f32("Copy", dst), be.f32("Copy", src)
	check.Len("Copy", s.n, d.n)
	be.dispatch1D(kernelCopy, d.n, []bufRef{d.ref(), s.ref()}, &kernelArgs{i: [8]int32{i32(d.n)}})
}

// Add implements tensor.Backend.
func (be *Backend) Add(dst, a, b tensor.Buffer) {
	d, ab, bb := be.f32("Add", dst), be.f32("Add", a), be.f32("Add", b)
	check.Add(d.n, ab.n, bb.n)
	be.dispatch1D(kernelAdd, d.n, []bufRef{d.ref(), ab.ref(), bb.ref()}, &kernelArgs{i: [8]int32{i32(d.n)}})
}

// Axpy implements tensor.Backend.
func (be *Backend) Axpy(alpha float32, x, y tensor.Buffer) {
	xb, yb := be.f32("Axpy", x), be.f32("Axpy", y)
	check.Len("Axpy", xb.n, yb.n)
	be.dispatch1D(kernelAxpy, yb.n, []bufRef{xb.ref(), yb.ref()}, &kernelArgs{i: [8]int32{i32(yb.n)}, f: [8]float32{alpha}})
}

// Scale implements tensor.Backend.
func (be *Backend) Scale(x tensor.Buffer, alpha float32) {
	b := be.f32("Scale", x)
	be.dispatch1D(kernelScale, b.n, []bufRef{b.ref()}, &kernelArgs{i: [8]int32{i32(b.n)}, f: [8]float32{alpha}})
}

// SumSquares implements tensor.Backend: float32 partial sums per
// threadgroup, added in order in float64 on the host.
func (be *Backend) SumSquares(x tensor.Buffer) float64 {
	b := be.f32("SumSquares", x)
	if b.n == 0 {
		return 0
	}
	defer be.lock()()
	tg := min(threads, be.drv.maxThreads(kernelSumSqPartial)/simdWidth*simdWidth)
	groups := min(max((b.n+tg*4-1)/(tg*4), 1), 1024)
	size := blockSize(4 * int64(groups))
	part := be.allocLocked(size)
	defer be.freeLocked(part, size)
	be.dispatchLocked(kernelSumSqPartial, [3]int{groups, 1, 1}, tg, []bufRef{{part, 0}, b.ref()},
		&kernelArgs{i: [8]int32{i32(b.n)}})
	var s float64
	for _, p := range be.readFloatsLocked(part, groups) {
		s += float64(p)
	}
	return s
}

// Softmax implements tensor.Backend.
func (be *Backend) Softmax(dst, x tensor.Buffer, cols int) {
	d, xb := be.f32("Softmax", dst), be.f32("Softmax", x)
	rows := check.Softmax(d.n, xb.n, cols)
	if rows == 0 {
		return
	}
	defer be.lock()()
	be.dispatchLocked(kernelSoftmax, [3]int{min(rows, maxGroups), 1, 1}, be.rowThreads(kernelSoftmax, cols),
		[]bufRef{d.ref(), xb.ref()}, &kernelArgs{i: [8]int32{i32(rows), i32(cols)}})
}

// Gather implements tensor.Backend. An id outside the table zeroes its row
// and makes the next Sync fail with ErrBadIndex.
func (be *Backend) Gather(dst, table, ids tensor.Buffer, dim int) {
	d, t, id := be.f32("Gather", dst), be.f32("Gather", table), be.i32("Gather", ids)
	vocab := check.Gather(d.n, t.n, id.n, dim)
	if id.n == 0 {
		return
	}
	defer be.lock()()
	be.dispatchLocked(kernelGather, [3]int{min(id.n, maxGroups), 1, 1}, be.rowThreads(kernelGather, dim),
		[]bufRef{d.ref(), t.ref(), id.ref(), be.errRef()}, &kernelArgs{i: [8]int32{i32(id.n), i32(dim), i32(vocab)}})
}

// ScatterAdd implements tensor.Backend: one thread per column adds the
// rows in order, as the cpu backend does. An id outside the table is
// skipped and makes the next Sync fail with ErrBadIndex.
func (be *Backend) ScatterAdd(table, ids, src tensor.Buffer, dim int) {
	t, id, s := be.f32("ScatterAdd", table), be.i32("ScatterAdd", ids), be.f32("ScatterAdd", src)
	vocab := check.ScatterAdd(t.n, id.n, s.n, dim)
	if id.n == 0 {
		return
	}
	defer be.lock()()
	be.dispatchLocked(kernelScatterAdd, [3]int{(dim + 127) / 128, 1, 1}, 128,
		[]bufRef{t.ref(), id.ref(), s.ref(), be.errRef()}, &kernelArgs{i: [8]int32{i32(id.n), i32(dim), i32(vocab)}})
}

// RMSNorm implements tensor.Backend.
func (be *Backend) RMSNorm(out, rstd, x, w tensor.Buffer, dim int, eps float32) {
	o, rs, xb, wb := be.f32("RMSNorm", out), be.f32("RMSNorm", rstd), be.f32("RMSNorm", x), be.f32("RMSNorm", w)
	rows := check.RMSNorm(o.n, rs.n, xb.n, wb.n, dim)
	if rows == 0 {
		return
	}
	defer be.lock()()
	be.dispatchLocked(kernelRMSNorm, [3]int{min(rows, maxGroups), 1, 1}, be.rowThreads(kernelRMSNorm, dim),
		[]bufRef{o.ref(), rs.ref(), xb.ref(), wb.ref()}, &kernelArgs{i: [8]int32{i32(rows), i32(dim)}, f: [8]float32{eps}})
}

// dwSegment is the number of rows one thread sums for dw before the
// segments are added in order.
const dwSegment = 256

// RMSNormBackward implements tensor.Backend.
func (be *Backend) RMSNormBackward(dx, dw, dy, x, w, rstd tensor.Buffer, dim int) {
	op := "RMSNormBackward"
	dxb, dwb, dyb := be.f32(op, dx), be.f32(op, dw), be.f32(op, dy)
	xb, wb, rs := be.f32(op, x), be.f32(op, w), be.f32(op, rstd)
	rows := check.RMSNormBackward(dxb.n, dwb.n, dyb.n, xb.n, wb.n, rs.n, dim)
	if rows == 0 {
		return
	}
	segs := (rows + dwSegment - 1) / dwSegment
	defer be.lock()()
	be.dispatchLocked(kernelRMSNormBackwardDx, [3]int{min(rows, maxGroups), 1, 1}, be.rowThreads(kernelRMSNormBackwardDx, dim),
		[]bufRef{dxb.ref(), dyb.ref(), xb.ref(), wb.ref(), rs.ref()}, &kernelArgs{i: [8]int32{i32(rows), i32(dim)}})
	size := blockSize(4 * int64(segs) * int64(dim))
	part := be.allocLocked(size)
	defer be.freeLocked(part, size)
	cols := (dim + 127) / 128
	be.dispatchLocked(kernelRMSNormBackwardDwPartial, [3]int{cols, segs, 1}, 128,
		[]bufRef{{part, 0}, dyb.ref(), xb.ref(), rs.ref()}, &kernelArgs{i: [8]int32{i32(rows), i32(dim), dwSegment}})
	be.dispatchLocked(kernelRMSNormBackwardDwFinal, [3]int{cols, 1, 1}, 128,
		[]bufRef{dwb.ref(), {part, 0}}, &kernelArgs{i: [8]int32{i32(dim), i32(segs)}})
}

// RoPE implements tensor.Backend. A negative position leaves its row
// untouched and makes the next Sync fail with ErrBadIndex.
func (be *Backend) RoPE(x, pos, invFreq tensor.Buffer, heads, headDim int, inverse bool) {
	xb, pb, fb := be.f32("RoPE", x), be.i32("RoPE", pos), be.f32("RoPE", invFreq)
	rows := check.RoPE(xb.n, pb.n, fb.n, heads, headDim)
	var sign float32 = 1
	if inverse {
		sign = -1
	}
	be.dispatch1D(kernelRoPE, rows*headDim/2, []bufRef{xb.ref(), pb.ref(), fb.ref(), be.errRef()},
		&kernelArgs{i: [8]int32{i32(rows), i32(heads), i32(headDim)}, f: [8]float32{sign}})
}

// SwiGLU implements tensor.Backend.
func (be *Backend) SwiGLU(out, gate, up tensor.Buffer) {
	o, g, u := be.f32("SwiGLU", out), be.f32("SwiGLU", gate), be.f32("SwiGLU", up)
	check.SwiGLU(o.n, g.n, u.n)
	be.dispatch1D(kernelSwiGLU, o.n, []bufRef{o.ref(), g.ref(), u.ref()}, &kernelArgs{i: [8]int32{i32(o.n)}})
}

// SwiGLUBackward implements tensor.Backend.
func (be *Backend) SwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer) {
	op := "SwiGLUBackward"
	dg, du, do, g, u := be.f32(op, dgate), be.f32(op, dup), be.f32(op, dout), be.f32(op, gate), be.f32(op, up)
	check.SwiGLUBackward(dg.n, du.n, do.n, g.n, u.n)
	be.dispatch1D(kernelSwiGLUBackward, do.n, []bufRef{dg.ref(), du.ref(), do.ref(), g.ref(), u.ref()},
		&kernelArgs{i: [8]int32{i32(do.n)}})
}

func checkAttn(op string, s tensor.AttnShape, q, k, v, out, lse *buffer) {
	check.Attention(op, s, q.n, k.n, v.n, out.n, lse.n)
	if s.HeadDim > attnMaxDim {
		panic(fmt.Sprintf("metal: %s: head dim %d is more than the kernels' %d", op, s.HeadDim, attnMaxDim))
	}
}

func attnArgs(s tensor.AttnShape) *kernelArgs {
	return &kernelArgs{
		i: [8]int32{i32(s.Heads), i32(s.KVHeads), i32(s.HeadDim), i32(s.SeqQ), i32(s.SeqK), i32(s.QOffset)},
		f: [8]float32{s.Scale},
	}
}

// Attention implements tensor.Backend: one threadgroup per (query row,
// head, sequence), see kernels.metal.
func (be *Backend) Attention(out, lse, q, k, v tensor.Buffer, s tensor.AttnShape) {
	op := "Attention"
	o, l, qb, kb, vb := be.f32(op, out), be.f32(op, lse), be.f32(op, q), be.f32(op, k), be.f32(op, v)
	checkAttn(op, s, qb, kb, vb, o, l)
	defer be.lock()()
	be.dispatchLocked(kernelAttnForward, [3]int{s.SeqQ, s.Heads, s.Batch}, attnThreads,
		[]bufRef{o.ref(), l.ref(), qb.ref(), kb.ref(), vb.ref()}, attnArgs(s))
}

// AttentionBackward implements tensor.Backend: a kernel per query row
// writes dq and D = dO·O, then a kernel per key row writes dk and dv.
func (be *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse tensor.Buffer, s tensor.AttnShape) {
	op := "AttentionBackward"
	dqb, dkb, dvb, dob := be.f32(op, dq), be.f32(op, dk), be.f32(op, dv), be.f32(op, dout)
	qb, kb, vb, ob, lb := be.f32(op, q), be.f32(op, k), be.f32(op, v), be.f32(op, out), be.f32(op, lse)
	checkAttn(op, s, qb, kb, vb, ob, lb)
	check.AttentionGrads(dqb.n, dkb.n, dvb.n, dob.n, qb.n, kb.n, vb.n)
	defer be.lock()()
	size := blockSize(4 * int64(lb.n))
	dsum := be.allocLocked(size)
	defer be.freeLocked(dsum, size)
	args := attnArgs(s)
	be.dispatchLocked(kernelAttnBackwardQ, [3]int{s.SeqQ, s.Heads, s.Batch}, attnThreads,
		[]bufRef{dqb.ref(), {dsum, 0}, dob.ref(), qb.ref(), kb.ref(), vb.ref(), ob.ref(), lb.ref()}, args)
	be.dispatchLocked(kernelAttnBackwardKV, [3]int{s.SeqK, s.KVHeads, s.Batch}, attnThreads,
		[]bufRef{dkb.ref(), dvb.ref(), dob.ref(), qb.ref(), kb.ref(), vb.ref(), lb.ref(), {dsum, 0}}, args)
}

// SoftmaxCrossEntropy implements tensor.Backend. The per-row losses are
// read from unified memory and added in row order in float64. A target ≥
// vocab zeroes its row and makes the next Sync fail with ErrBadIndex.
func (be *Backend) SoftmaxCrossEntropy(dlogits, logits, targets tensor.Buffer, vocab int, scale float32) float64 {
	op := "SoftmaxCrossEntropy"
	d, x, tg := be.f32(op, dlogits), be.f32(op, logits), be.i32(op, targets)
	rows := check.SoftmaxCrossEntropy(d.n, x.n, tg.n, vocab)
	if rows == 0 {
		return 0
	}
	defer be.lock()()
	size := blockSize(4 * int64(rows))
	loss := be.allocLocked(size)
	defer be.freeLocked(loss, size)
	be.dispatchLocked(kernelSoftmaxXent, [3]int{min(rows, maxGroups), 1, 1}, be.rowThreads(kernelSoftmaxXent, vocab),
		[]bufRef{d.ref(), x.ref(), tg.ref(), {loss, 0}, be.errRef()},
		&kernelArgs{i: [8]int32{i32(rows), i32(vocab)}, f: [8]float32{scale}})
	var s float64
	for _, l := range be.readFloatsLocked(loss, rows) {
		s += float64(l)
	}
	return s
}

// AdamW implements tensor.Backend with the cpu backend's float64 bias
// corrections and float32 update.
func (be *Backend) AdamW(p, g, m, v tensor.Buffer, h tensor.AdamWStep) {
	pb, gb, mb, vb := be.f32("AdamW", p), be.f32("AdamW", g), be.f32("AdamW", m), be.f32("AdamW", v)
	check.AdamW(pb.n, gb.n, mb.n, vb.n, h)
	bc1 := 1 - math.Pow(float64(h.Beta1), float64(h.Step))
	bc2 := 1 - math.Pow(float64(h.Beta2), float64(h.Step))
	be.dispatch1D(kernelAdamW, pb.n, []bufRef{pb.ref(), gb.ref(), mb.ref(), vb.ref()}, &kernelArgs{
		i: [8]int32{i32(pb.n)},
		f: [8]float32{1 - h.LR*h.WeightDecay, h.Beta1, h.Beta2, h.Eps, h.GradScale,
			float32(float64(h.LR) / bc1), float32(math.Sqrt(bc2))},
	})
}
