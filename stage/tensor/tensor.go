// Package tensor is the math a pipeline stage needs, behind one small,
// device-neutral interface.
//
// A Backend owns opaque Buffers (float32 or int32 vectors living wherever
// the device keeps memory) and runs a fixed set of operations on them:
// GEMM in its transposed forms, a few elementwise ops, and fused forward
// and backward kernels for the layers of a Llama-style decoder (RMSNorm,
// rotary embeddings, causal grouped-query attention, SwiGLU, softmax
// cross-entropy) plus the AdamW update. Host memory is touched only through
// Upload and Download, which a stage calls at its boundaries.
//
// Shapes are passed as plain ints; every matrix is row-major and
// contiguous. An operation given buffers whose lengths do not fit its
// shape panics: that is a programming error, and stages validate untrusted
// input before any compute runs. Device errors that surface
// asynchronously are reported by Sync.
//
// Backends register themselves by name (the cpu backend in package
// tensor/cpu, GPU ones behind build tags) and are opened with Open.
//
// A new backend is done when its tests pass
//
//	tensortest.CheckBackend(t, be)             // float64 references, finite differences
//	tensortest.CheckParity(t, be, cpu.New(), 0) // same inputs as cpu
//
// and the model tests pass with model.WithBackend(be). Stages allocate and
// free activation buffers per microbatch, so a device backend wants a
// caching allocator behind Alloc and Free.
package tensor

import "fmt"

// DType is the element type of a Buffer.
type DType uint8

const (
	Float32 DType = iota + 1
	Int32
	// BFloat16 holds weights at 2 bytes per value (the top half of a
	// float32). Only a backend that reports Supports(BFloat16) has it, and
	// there only as the stored matrix of Gemm's B, the table of Gather,
	// and through Upload (rounding to nearest even) and Download (exact).
	BFloat16
)

// Supporter is implemented by backends that hold more dtypes than Float32
// and Int32.
type Supporter interface {
	Supports(DType) bool
}

// Supports reports whether be can allocate buffers of dt.
func Supports(be Backend, dt DType) bool {
	if dt == Float32 || dt == Int32 {
		return true
	}
	s, ok := be.(Supporter)
	return ok && s.Supports(dt)
}

// Size is the number of bytes one element of d takes.
func (d DType) Size() int {
	if d == BFloat16 {
		return 2
	}
	return 4
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Int32:
		return "int32"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Buffer is a vector of Len elements of one DType in a backend's memory.
// A Buffer may only be passed to the Backend that made it.
type Buffer interface {
	Len() int
	DType() DType
}

// AttnShape describes one causal grouped-query attention call.
//
// Layouts (row-major):
//
//	q, out: [Batch·SeqQ, Heads·HeadDim]
//	k, v:   [Batch·SeqK, KVHeads·HeadDim]
//	lse:    [Batch, Heads, SeqQ]   (log-sum-exp of each softmax row)
//
// Query row i of a sequence sits at absolute position QOffset+i and sees
// keys 0..QOffset+i (causal). Training uses SeqQ = SeqK and QOffset = 0;
// decoding with a KV cache uses SeqK = QOffset+SeqQ. Query head h reads
// key/value head h/(Heads/KVHeads), as transformers' repeat_kv does.
type AttnShape struct {
	Batch, Heads, KVHeads, HeadDim int
	SeqQ, SeqK, QOffset            int
	Scale                          float32 // usually 1/sqrt(HeadDim)
}

// Validate reports the first inconsistent field.
func (s AttnShape) Validate() error {
	switch {
	case s.Batch <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0:
		return fmt.Errorf("tensor: attention shape %+v: sizes must be positive", s)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("tensor: attention heads %d not a multiple of kv heads %d", s.Heads, s.KVHeads)
	case s.SeqQ <= 0 || s.SeqK <= 0 || s.QOffset < 0:
		return fmt.Errorf("tensor: attention shape %+v: bad sequence lengths", s)
	case s.QOffset+s.SeqQ > s.SeqK:
		return fmt.Errorf("tensor: attention queries reach position %d beyond %d keys", s.QOffset+s.SeqQ, s.SeqK)
	}
	return nil
}

// AdamWStep holds the scalars of one AdamW update (PyTorch semantics,
// decoupled weight decay):
//
//	g  = GradScale·grad
//	p  = p·(1 − LR·WeightDecay)
//	m  = Beta1·m + (1−Beta1)·g
//	v  = Beta2·v + (1−Beta2)·g²
//	p -= LR · (m/(1−Beta1^Step)) / (sqrt(v/(1−Beta2^Step)) + Eps)
//
// Step counts from 1.
type AdamWStep struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	GradScale                          float32
	Step                               int
}

// Backend is a device that holds Buffers and runs the ops of a stage.
// Implementations must be safe for concurrent use by several stages on
// different buffers. Ops run in call order as seen by one goroutine.
//
// Conventions: "rows" is a buffer's length divided by its row width. An
// output that the doc marks "+=" accumulates into what is there; all other
// outputs are overwritten. Unless stated, outputs must not alias inputs.
type Backend interface {
	// Name is the name the backend was registered under ("cpu", "cuda").
	Name() string

	// Alloc returns a zero-filled buffer of n elements.
	Alloc(dt DType, n int) Buffer
	// Free releases b. Using b afterwards is an error. Views are not freed.
	Free(b Buffer)
	// View is elements [off, off+n) of b, sharing its memory.
	View(b Buffer, off, n int) Buffer
	// Upload copies host data into dst (len(src) == dst.Len()).
	Upload(dst Buffer, src []float32)
	// UploadInt32 copies host int32 data into an Int32 buffer.
	UploadInt32(dst Buffer, src []int32)
	// Download copies src into host memory (len(dst) == src.Len()).
	Download(dst []float32, src Buffer)
	// Sync waits for queued work and reports a device error, if any.
	Sync() error

	// Gemm computes C = alpha·op(A)·op(B) + beta·C, with op(A) m×k, op(B)
	// k×n and C m×n, all contiguous row-major; op(X) is Xᵀ when trans is set.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a, b Buffer, beta float32, c Buffer)

	// Fill sets every element of x to v.
	Fill(x Buffer, v float32)
	// Copy copies src into dst (equal lengths).
	Copy(dst, src Buffer)
	// Add sets dst = a + b; dst may alias a or b.
	Add(dst, a, b Buffer)
	// Axpy sets y += alpha·x.
	Axpy(alpha float32, x, y Buffer)
	// Scale sets x = alpha·x.
	Scale(x Buffer, alpha float32)
	// SumSquares returns Σ x² accumulated in at least float64 precision.
	SumSquares(x Buffer) float64
	// Softmax writes the row-wise softmax of x (rows of width cols) to dst;
	// dst may alias x.
	Softmax(dst, x Buffer, cols int)

	// Gather sets dst[i,:] = table[ids[i],:] for rows of width dim.
	Gather(dst, table, ids Buffer, dim int)
	// ScatterAdd sets table[ids[i],:] += src[i,:]; repeated ids accumulate.
	ScatterAdd(table, ids, src Buffer, dim int)

	// RMSNorm sets out = w ∘ (x·rstd) per row of width dim, with
	// rstd = 1/sqrt(mean(x²)+eps) in float32 (the transformers
	// LlamaRMSNorm), and stores rstd (one per row) for the backward.
	RMSNorm(out, rstd, x, w Buffer, dim int, eps float32)
	// RMSNormBackward: dx += ∂L/∂x and dw += ∂L/∂w given dy = ∂L/∂out.
	RMSNormBackward(dx, dw, dy, x, w, rstd Buffer, dim int)

	// RoPE rotates x in place, x laid out [rows, heads·headDim] with one
	// position per row (pos: Int32, len rows), using the rotate-half
	// convention of transformers' Llama: for i < headDim/2,
	//	x'[i]       = x[i]·cos − x[i+half]·sin
	//	x'[i+half]  = x[i+half]·cos + x[i]·sin
	// with angle = float32(pos)·invFreq[i] rounded to float32 (invFreq:
	// headDim/2 values, e.g. theta^(−2i/headDim), possibly rescaled as
	// Llama 3 does). inverse rotates by −angle, which is also the backward
	// of the forward rotation.
	RoPE(x, pos, invFreq Buffer, heads, headDim int, inverse bool)

	// SwiGLU sets out = silu(gate) ∘ up.
	SwiGLU(out, gate, up Buffer)
	// SwiGLUBackward sets dgate and dup from dout.
	SwiGLUBackward(dgate, dup, dout, gate, up Buffer)

	// Attention computes causal grouped-query attention (see AttnShape),
	// writing out and the per-row log-sum-exp needed by the backward.
	Attention(out, lse, q, k, v Buffer, s AttnShape)
	// AttentionBackward sets dq, dk and dv from dout, recomputing the
	// probabilities from q, k and lse.
	AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse Buffer, s AttnShape)

	// SoftmaxCrossEntropy treats logits as rows of width vocab and targets
	// (Int32, one per row; negative means ignore) as labels. It writes
	// dlogits = scale·(softmax(logits) − onehot(target)) (zero rows where
	// ignored) and returns Σ −log softmax(logits)[target] over the rows
	// that are not ignored, unscaled. dlogits may alias logits.
	SoftmaxCrossEntropy(dlogits, logits, targets Buffer, vocab int, scale float32) float64

	// AdamW updates p, m and v in place from g (see AdamWStep).
	AdamW(p, g, m, v Buffer, h AdamWStep)
}
