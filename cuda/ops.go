//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"

	"github.com/holopeer/holopeer/stage/tensor"
)

// Gemm implements tensor.Backend with cublasSgemm. cuBLAS is column-major:
// a row-major C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, which
// is the same call with the operands swapped.
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
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	defer be.lock()()
	if err := be.drv.sgemm(transB, transA, n, m, k, alpha, bb.ptr, ldb, ab.ptr, lda, beta, cb.ptr, n); err != nil {
		be.failLocked("cublasSgemm", err)
	}
}

// Fill implements tensor.Backend.
func (be *Backend) Fill(x tensor.Buffer, v float32) {
	b := be.f32("Fill", x)
	if b.n == 0 {
		return
	}
	defer be.lock()()
	if err := be.drv.memset32(b.ptr, math.Float32bits(v), b.n); err != nil {
		be.failLocked("filling a buffer", err)
	}
}

// Copy implements tensor.Backend.
func (be *Backend) Copy(dst, src tensor.Buffer) {
	d, s := be.f32("Copy", dst), be.f32("Copy", src)
	check.Len("Copy", s.n, d.n)
	if d.n == 0 {
		return
	}
	defer be.lock()()
	if err := be.drv.dtod(d.ptr, s.ptr, 4*int64(d.n)); err != nil {
		be.failLocked("copying on the device", err)
	}
}

// Add implements tensor.Backend.
func (be *Backend) Add(dst, a, b tensor.Buffer) {
	d, ab, bb := be.f32("Add", dst), be.f32("Add", a), be.f32("Add", b)
	check.Add(d.n, ab.n, bb.n)
	be.launch1D("hp_add", d.n, ptrArg(d), ptrArg(ab), ptrArg(bb), longArg(d.n))
}

// Axpy implements tensor.Backend.
func (be *Backend) Axpy(alpha float32, x, y tensor.Buffer) {
	xb, yb := be.f32("Axpy", x), be.f32("Axpy", y)
	check.Len("Axpy", xb.n, yb.n)
	be.launch1D("hp_axpy", yb.n, floatArg(alpha), ptrArg(xb), ptrArg(yb), longArg(yb.n))
}

// Scale implements tensor.Backend.
func (be *Backend) Scale(x tensor.Buffer, alpha float32) {
	b := be.f32("Scale", x)
	be.launch1D("hp_scale", b.n, ptrArg(b), floatArg(alpha), longArg(b.n))
}

// SumSquares implements tensor.Backend: float64 partial sums per block on
// the device, added in order on the host.
func (be *Backend) SumSquares(x tensor.Buffer) float64 {
	b := be.f32("SumSquares", x)
	if b.n == 0 {
		return 0
	}
	grid := min(max((b.n+threads*4-1)/(threads*4), 1), 1024)
	defer be.lock()()
	size := blockSize(8 * int64(grid))
	part := be.allocLocked(size)
	defer be.freeLocked(part, size)
	be.launchLocked("hp_sumsq_partial", [3]int{grid, 1, 1}, threads, 0, devArg(part), ptrArg(b), longArg(b.n))
	var s float64
	for _, p := range be.downloadF64Locked(part, grid) {
		s += p
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
	be.launchLocked("hp_softmax", [3]int{min(rows, maxGrid), 1, 1}, rowThreads(cols), 0,
		ptrArg(d), ptrArg(xb), intArg(rows), intArg(cols))
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
	be.launchLocked("hp_gather", [3]int{min(id.n, maxGrid), 1, 1}, rowThreads(dim), 0,
		ptrArg(d), ptrArg(t), ptrArg(id), intArg(id.n), intArg(dim), intArg(vocab), devArg(be.errWord))
}

// ScatterAdd implements tensor.Backend: one thread per column adds the
// rows in order, exactly as the cpu backend does. An id outside the table
// is skipped and makes the next Sync fail with ErrBadIndex.
func (be *Backend) ScatterAdd(table, ids, src tensor.Buffer, dim int) {
	t, id, s := be.f32("ScatterAdd", table), be.i32("ScatterAdd", ids), be.f32("ScatterAdd", src)
	vocab := check.ScatterAdd(t.n, id.n, s.n, dim)
	if id.n == 0 {
		return
	}
	defer be.lock()()
	be.launchLocked("hp_scatter_add", [3]int{(dim + 127) / 128, 1, 1}, 128, 0,
		ptrArg(t), ptrArg(id), ptrArg(s), intArg(id.n), intArg(dim), intArg(vocab), devArg(be.errWord))
}

// RMSNorm implements tensor.Backend.
func (be *Backend) RMSNorm(out, rstd, x, w tensor.Buffer, dim int, eps float32) {
	o, rs, xb, wb := be.f32("RMSNorm", out), be.f32("RMSNorm", rstd), be.f32("RMSNorm", x), be.f32("RMSNorm", w)
	rows := check.RMSNorm(o.n, rs.n, xb.n, wb.n, dim)
	if rows == 0 {
		return
	}
	defer be.lock()()
	be.launchLocked("hp_rmsnorm", [3]int{min(rows, maxGrid), 1, 1}, rowThreads(dim), 0,
		ptrArg(o), ptrArg(rs), ptrArg(xb), ptrArg(wb), intArg(rows), intArg(dim), floatArg(eps))
}

// dwSegment is the number of rows one thread sums for dw before the
// segments are added in order; up to this many rows the sum is the cpu
// backend's, bit for bit.
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
	if segs > maxGridYZ {
		panic(fmt.Sprintf("cuda: RMSNormBackward: %d rows are more than %d", rows, maxGridYZ*dwSegment))
	}
	defer be.lock()()
	be.launchLocked("hp_rmsnorm_backward_dx", [3]int{min(rows, maxGrid), 1, 1}, rowThreads(dim), 0,
		ptrArg(dxb), ptrArg(dyb), ptrArg(xb), ptrArg(wb), ptrArg(rs), intArg(rows), intArg(dim))
	size := blockSize(8 * int64(segs) * int64(dim))
	part := be.allocLocked(size)
	defer be.freeLocked(part, size)
	cols := (dim + 127) / 128
	be.launchLocked("hp_rmsnorm_backward_dw_partial", [3]int{cols, segs, 1}, 128, 0,
		devArg(part), ptrArg(dyb), ptrArg(xb), ptrArg(rs), intArg(rows), intArg(dim), intArg(dwSegment))
	be.launchLocked("hp_rmsnorm_backward_dw_final", [3]int{cols, 1, 1}, 128, 0,
		ptrArg(dwb), devArg(part), intArg(dim), intArg(segs))
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
	be.launch1D("hp_rope", rows*headDim/2, ptrArg(xb), ptrArg(pb), ptrArg(fb), intArg(rows), intArg(heads),
		intArg(headDim), floatArg(sign), devArg(be.errWord))
}

// SwiGLU implements tensor.Backend.
func (be *Backend) SwiGLU(out, gate, up tensor.Buffer) {
	o, g, u := be.f32("SwiGLU", out), be.f32("SwiGLU", gate), be.f32("SwiGLU", up)
	check.SwiGLU(o.n, g.n, u.n)
	be.launch1D("hp_swiglu", o.n, ptrArg(o), ptrArg(g), ptrArg(u), longArg(o.n))
}

// SwiGLUBackward implements tensor.Backend.
func (be *Backend) SwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer) {
	op := "SwiGLUBackward"
	dg, du, do, g, u := be.f32(op, dgate), be.f32(op, dup), be.f32(op, dout), be.f32(op, gate), be.f32(op, up)
	check.SwiGLUBackward(dg.n, du.n, do.n, g.n, u.n)
	be.launch1D("hp_swiglu_backward", do.n, ptrArg(dg), ptrArg(du), ptrArg(do), ptrArg(g), ptrArg(u), longArg(do.n))
}

// checkAttn validates an attention call against its shape.
func (be *Backend) checkAttn(op string, s tensor.AttnShape, q, k, v, out, lse *buffer) {
	check.Attention(op, s, q.n, k.n, v.n, out.n, lse.n)
	if s.HeadDim > attnThread*attnCols {
		panic(fmt.Sprintf("cuda: %s: head dim %d is more than the kernels' %d", op, s.HeadDim, attnThread*attnCols))
	}
	if s.Heads > maxGridYZ || s.Batch > maxGridYZ {
		panic(fmt.Sprintf("cuda: %s: %d heads or %d sequences are more than %d", op, s.Heads, s.Batch, maxGridYZ))
	}
}

func attnArgs(s tensor.AttnShape) []uint64 {
	return []uint64{intArg(s.Heads), intArg(s.KVHeads), intArg(s.HeadDim), intArg(s.SeqQ), intArg(s.SeqK),
		intArg(s.QOffset), floatArg(s.Scale)}
}

// Attention implements tensor.Backend: one block per (query row, head,
// sequence), see attention.cu.
func (be *Backend) Attention(out, lse, q, k, v tensor.Buffer, s tensor.AttnShape) {
	op := "Attention"
	o, l, qb, kb, vb := be.f32(op, out), be.f32(op, lse), be.f32(op, q), be.f32(op, k), be.f32(op, v)
	be.checkAttn(op, s, qb, kb, vb, o, l)
	defer be.lock()()
	args := append([]uint64{ptrArg(o), ptrArg(l), ptrArg(qb), ptrArg(kb), ptrArg(vb)}, attnArgs(s)...)
	be.launchLocked("hp_attn_forward", [3]int{s.SeqQ, s.Heads, s.Batch}, attnThread, 4*s.HeadDim, args...)
}

// AttentionBackward implements tensor.Backend: a kernel per query row
// writes dq and D = dO·O, then a kernel per key row writes dk and dv.
func (be *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse tensor.Buffer, s tensor.AttnShape) {
	op := "AttentionBackward"
	dqb, dkb, dvb, dob := be.f32(op, dq), be.f32(op, dk), be.f32(op, dv), be.f32(op, dout)
	qb, kb, vb, ob, lb := be.f32(op, q), be.f32(op, k), be.f32(op, v), be.f32(op, out), be.f32(op, lse)
	be.checkAttn(op, s, qb, kb, vb, ob, lb)
	check.AttentionGrads(dqb.n, dkb.n, dvb.n, dob.n, qb.n, kb.n, vb.n)
	defer be.lock()()
	size := blockSize(4 * int64(lb.n))
	dsum := be.allocLocked(size)
	defer be.freeLocked(dsum, size)
	shape := attnArgs(s)
	argsQ := append([]uint64{ptrArg(dqb), devArg(dsum), ptrArg(dob), ptrArg(qb), ptrArg(kb), ptrArg(vb),
		ptrArg(ob), ptrArg(lb)}, shape...)
	be.launchLocked("hp_attn_backward_q", [3]int{s.SeqQ, s.Heads, s.Batch}, attnThread, 8*s.HeadDim, argsQ...)
	argsKV := append([]uint64{ptrArg(dkb), ptrArg(dvb), ptrArg(dob), ptrArg(qb), ptrArg(kb), ptrArg(vb),
		ptrArg(lb), devArg(dsum)}, shape...)
	be.launchLocked("hp_attn_backward_kv", [3]int{s.SeqK, s.KVHeads, s.Batch}, attnThread, 8*s.HeadDim, argsKV...)
}

// SoftmaxCrossEntropy implements tensor.Backend. The per-row losses come
// back to the host and are added in row order. A target ≥ vocab zeroes its
// row and makes the next Sync fail with ErrBadIndex.
func (be *Backend) SoftmaxCrossEntropy(dlogits, logits, targets tensor.Buffer, vocab int, scale float32) float64 {
	op := "SoftmaxCrossEntropy"
	d, x, tg := be.f32(op, dlogits), be.f32(op, logits), be.i32(op, targets)
	rows := check.SoftmaxCrossEntropy(d.n, x.n, tg.n, vocab)
	if rows == 0 {
		return 0
	}
	defer be.lock()()
	size := blockSize(8 * int64(rows))
	loss := be.allocLocked(size)
	defer be.freeLocked(loss, size)
	be.launchLocked("hp_softmax_xent", [3]int{min(rows, maxGrid), 1, 1}, rowThreads(vocab), 0,
		ptrArg(d), ptrArg(x), ptrArg(tg), devArg(loss), intArg(rows), intArg(vocab), floatArg(scale), devArg(be.errWord))
	var s float64
	for _, l := range be.downloadF64Locked(loss, rows) {
		s += l
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
	stepSize := float32(float64(h.LR) / bc1)
	bc2Sqrt := float32(math.Sqrt(bc2))
	decay := 1 - h.LR*h.WeightDecay
	be.launch1D("hp_adamw", pb.n, ptrArg(pb), ptrArg(gb), ptrArg(mb), ptrArg(vb), longArg(pb.n), floatArg(decay),
		floatArg(h.Beta1), floatArg(h.Beta2), floatArg(h.Eps), floatArg(h.GradScale), floatArg(stepSize), floatArg(bc2Sqrt))
}
