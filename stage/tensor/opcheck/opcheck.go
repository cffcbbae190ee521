// Package opcheck holds the checks of tensor.Backend calls that do not
// depend on the device, for the device backends (cuda, metal) to share:
// buffer lengths against the op's shape before anything is queued, and
// the out-of-range indices that kernels report through their error word
// after. A failed check panics with the backend's name first, as a
// misused tensor.Backend must not run on garbage.
package opcheck

import (
	"fmt"

	"github.com/holopeer/holopeer/stage/tensor"
)

// Checker checks calls of the backend it names ("cuda", "metal"); the
// name starts every panic message.
type Checker string

func (c Checker) fail(format string, args ...any) {
	panic(string(c) + ": " + fmt.Sprintf(format, args...))
}

// Len checks that op got a buffer of want elements.
func (c Checker) Len(op string, got, want int) {
	if got != want {
		c.fail("%s: length %d, want %d", op, got, want)
	}
}

// Rows checks that n elements are whole rows of dim and returns how many.
func (c Checker) Rows(op string, n, dim int) int {
	if dim <= 0 || n%dim != 0 {
		c.fail("%s: length %d is not a multiple of row width %d", op, n, dim)
	}
	return n / dim
}

// Alloc checks an allocation of n elements of dt.
func (c Checker) Alloc(dt tensor.DType, n int) {
	if n < 0 {
		c.fail("negative allocation %d", n)
	}
	if dt != tensor.Float32 && dt != tensor.Int32 {
		c.fail("unknown dtype %s", dt)
	}
}

// View checks a view of n elements at off into a buffer of size.
func (c Checker) View(off, n, size int) {
	if off < 0 || n < 0 || off+n > size {
		c.fail("view [%d,%d) of a buffer of %d", off, off+n, size)
	}
}

// Gemm checks C[m×n] = op(A)[m×k]·op(B)[k×n] against the buffers'
// lengths a, b and cn.
func (c Checker) Gemm(m, n, k, a, b, cn int) {
	if m < 0 || n < 0 || k < 0 || a != m*k || b != k*n || cn != m*n {
		c.fail("Gemm %dx%dx%d with buffers a=%d b=%d c=%d", m, n, k, a, b, cn)
	}
}

// Add checks dst = a + b.
func (c Checker) Add(dst, a, b int) {
	c.Len("Add", a, dst)
	c.Len("Add", b, dst)
}

// Softmax checks a row softmax of x into dst, cols wide, and returns the
// rows.
func (c Checker) Softmax(dst, x, cols int) (rows int) {
	c.Len("Softmax", x, dst)
	return c.Rows("Softmax", dst, cols)
}

// Gather checks dst = table[ids] of rows dim wide and returns the table's
// rows.
func (c Checker) Gather(dst, table, ids, dim int) (vocab int) {
	c.Len("Gather", dst, ids*dim)
	return c.Rows("Gather", table, dim)
}

// ScatterAdd checks table[ids] += src of rows dim wide and returns the
// table's rows.
func (c Checker) ScatterAdd(table, ids, src, dim int) (vocab int) {
	c.Len("ScatterAdd", src, ids*dim)
	return c.Rows("ScatterAdd", table, dim)
}

// RMSNorm checks a normalisation of x's rows, dim wide, and returns the
// rows.
func (c Checker) RMSNorm(out, rstd, x, w, dim int) (rows int) {
	c.Len("RMSNorm", out, x)
	c.Len("RMSNorm weight", w, dim)
	rows = c.Rows("RMSNorm", x, dim)
	c.Len("RMSNorm rstd", rstd, rows)
	return rows
}

// RMSNormBackward checks the backward of RMSNorm and returns the rows.
func (c Checker) RMSNormBackward(dx, dw, dy, x, w, rstd, dim int) (rows int) {
	c.Len("RMSNormBackward dx", dx, x)
	c.Len("RMSNormBackward dy", dy, x)
	c.Len("RMSNormBackward w", w, dim)
	c.Len("RMSNormBackward dw", dw, dim)
	rows = c.Rows("RMSNormBackward", x, dim)
	c.Len("RMSNormBackward rstd", rstd, rows)
	return rows
}

// RoPE checks a rotation of x's rows (heads of headDim each) at pos by
// invFreq and returns the rows.
func (c Checker) RoPE(x, pos, invFreq, heads, headDim int) (rows int) {
	if headDim <= 0 || headDim%2 != 0 {
		c.fail("RoPE head dim %d must be even", headDim)
	}
	c.Len("RoPE frequencies", invFreq, headDim/2)
	rows = c.Rows("RoPE", x, heads*headDim)
	c.Len("RoPE positions", pos, rows)
	return rows
}

// SwiGLU checks out = silu(gate)·up.
func (c Checker) SwiGLU(out, gate, up int) {
	c.Len("SwiGLU", gate, out)
	c.Len("SwiGLU", up, out)
}

// SwiGLUBackward checks the backward of SwiGLU.
func (c Checker) SwiGLUBackward(dgate, dup, dout, gate, up int) {
	for _, l := range []int{dgate, dup, gate, up} {
		c.Len("SwiGLUBackward", l, dout)
	}
}

// Attention checks an attention call's buffers against its shape.
func (c Checker) Attention(op string, s tensor.AttnShape, q, k, v, out, lse int) {
	if err := s.Validate(); err != nil {
		c.fail("%s: %v", op, err)
	}
	qn := s.Batch * s.SeqQ * s.Heads * s.HeadDim
	kn := s.Batch * s.SeqK * s.KVHeads * s.HeadDim
	if q != qn || out != qn || k != kn || v != kn || lse != s.Batch*s.Heads*s.SeqQ {
		c.fail("%s: buffers q=%d k=%d v=%d out=%d lse=%d do not fit %+v", op, q, k, v, out, lse, s)
	}
}

// AttentionGrads checks the gradients of an AttentionBackward call
// against its inputs (checked with Attention).
func (c Checker) AttentionGrads(dq, dk, dv, dout, q, k, v int) {
	c.Len("AttentionBackward dq", dq, q)
	c.Len("AttentionBackward dout", dout, q)
	c.Len("AttentionBackward dk", dk, k)
	c.Len("AttentionBackward dv", dv, v)
}

// SoftmaxCrossEntropy checks a loss over logits' rows, vocab wide, and
// returns the rows.
func (c Checker) SoftmaxCrossEntropy(dlogits, logits, targets, vocab int) (rows int) {
	const op = "SoftmaxCrossEntropy"
	c.Len(op, logits, dlogits)
	rows = c.Rows(op, logits, vocab)
	c.Len("SoftmaxCrossEntropy targets", targets, rows)
	return rows
}

// AdamW checks an AdamW update of p with gradient g and moments m, v.
func (c Checker) AdamW(p, g, m, v int, h tensor.AdamWStep) {
	for _, l := range []int{g, m, v} {
		c.Len("AdamW", l, p)
	}
	if h.Step < 1 {
		c.fail("AdamW step counts from 1")
	}
}

// Bits of the error word that kernels set when they meet an index outside
// its table; every backend's kernels use these values (cuda/kernels/
// common.cuh, metal/kernels.metal).
const (
	ErrGatherID   = 1
	ErrScatterID  = 2
	ErrXentTarget = 4
	ErrRopePos    = 8
)

// IndexErrors says what the bits set in an error word mean.
func IndexErrors(word uint32) []string {
	var what []string
	for _, e := range []struct {
		bit  uint32
		what string
	}{
		{ErrGatherID, "Gather: id out of range"},
		{ErrScatterID, "ScatterAdd: id out of range"},
		{ErrXentTarget, "SoftmaxCrossEntropy: target out of range"},
		{ErrRopePos, "RoPE: negative position"},
	} {
		if word&e.bit != 0 {
			what = append(what, e.what)
		}
	}
	return what
}
