// Package cpu is the default tensor.Backend: host memory, GEMM through
// stage/gemm, and every other op written out in Go and spread over the
// cores where the work is large enough to pay for goroutines.
//
// Results do not depend on the number of workers: every reduction over
// more than one element is split into chunks of a fixed size, or
// partitioned so that each output element is summed by one goroutine in a
// fixed order. Runs are therefore bit-reproducible on one machine.
//
// Importing the package registers it as "cpu".
package cpu

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/holopeer/holopeer/stage/gemm"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
)

func init() {
	tensor.Register("cpu", 0, func() (tensor.Backend, error) { return New(), nil })
}

// Backend is the CPU implementation of tensor.Backend.
type Backend struct {
	workers int

	ropeMu sync.Mutex
	rope   map[string]*ropeTable // by the bits of the inverse frequencies
}

// Option configures a Backend.
type Option func(*Backend)

// WithWorkers sets how many goroutines one op may use (default
// GOMAXPROCS). Values below 1 mean 1.
func WithWorkers(n int) Option {
	return func(b *Backend) { b.workers = max(n, 1) }
}

// New returns a CPU backend.
func New(opts ...Option) *Backend {
	b := &Backend{workers: runtime.GOMAXPROCS(0), rope: map[string]*ropeTable{}}
	for _, o := range opts {
		o(b)
	}
	return b
}

var _ tensor.Backend = (*Backend)(nil)

// Name implements tensor.Backend.
func (*Backend) Name() string { return "cpu" }

// Supports implements tensor.Supporter: bfloat16 weights are stored at 2
// bytes and widened by the GEMM and Gather that read them.
func (*Backend) Supports(dt tensor.DType) bool {
	return dt == tensor.Float32 || dt == tensor.Int32 || dt == tensor.BFloat16
}

// buffer is host memory; exactly one of f, i and h is used, as dt says.
type buffer struct {
	dt tensor.DType
	f  []float32
	i  []int32
	h  []uint16 // bfloat16 bits
}

func (b *buffer) Len() int {
	switch b.dt {
	case tensor.Int32:
		return len(b.i)
	case tensor.BFloat16:
		return len(b.h)
	}
	return len(b.f)
}

func (b *buffer) DType() tensor.DType { return b.dt }

// own returns x as this backend's buffer of dtype dt, or panics: a buffer
// from another backend or of the wrong dtype is a programming error.
func own(x tensor.Buffer, dt tensor.DType) *buffer {
	b, ok := x.(*buffer)
	if !ok {
		panic(fmt.Sprintf("cpu: buffer of type %T does not belong to the cpu backend", x))
	}
	if b.dt != dt {
		panic("cpu: " + dt.String() + " buffer expected, got " + b.dt.String())
	}
	return b
}

func f32(x tensor.Buffer) []float32 { return own(x, tensor.Float32).f }

func bf16(x tensor.Buffer) []uint16 { return own(x, tensor.BFloat16).h }

func i32(x tensor.Buffer) []int32 { return own(x, tensor.Int32).i }

// Alloc implements tensor.Backend.
func (*Backend) Alloc(dt tensor.DType, n int) tensor.Buffer {
	if n < 0 {
		panic(fmt.Sprintf("cpu: negative allocation %d", n))
	}
	switch dt {
	case tensor.Float32:
		return &buffer{dt: dt, f: make([]float32, n)}
	case tensor.Int32:
		return &buffer{dt: dt, i: make([]int32, n)}
	case tensor.BFloat16:
		return &buffer{dt: dt, h: make([]uint16, n)}
	}
	panic("cpu: unknown dtype " + dt.String())
}

// Free implements tensor.Backend. Host memory goes back to the garbage
// collector; the buffer is emptied so that a use after Free fails loudly.
func (*Backend) Free(x tensor.Buffer) {
	if b, ok := x.(*buffer); ok {
		b.f, b.i, b.h = nil, nil, nil
	}
}

// View implements tensor.Backend.
func (*Backend) View(x tensor.Buffer, off, n int) tensor.Buffer {
	if off < 0 || n < 0 || off+n > x.Len() {
		panic(fmt.Sprintf("cpu: view [%d,%d) of a buffer of %d", off, off+n, x.Len()))
	}
	switch x.DType() {
	case tensor.Int32:
		return &buffer{dt: tensor.Int32, i: i32(x)[off : off+n : off+n]}
	case tensor.BFloat16:
		return &buffer{dt: tensor.BFloat16, h: bf16(x)[off : off+n : off+n]}
	}
	return &buffer{dt: tensor.Float32, f: f32(x)[off : off+n : off+n]}
}

// Upload implements tensor.Backend. Into a bfloat16 buffer each value is
// rounded to nearest, ties to even (exact for values that came from a
// bfloat16 checkpoint).
func (*Backend) Upload(dst tensor.Buffer, src []float32) {
	if dst.DType() == tensor.BFloat16 {
		d := bf16(dst)
		mustLen("Upload", len(src), len(d))
		for i, v := range src {
			d[i] = safetensors.Float32ToBF16(v)
		}
		return
	}
	d := f32(dst)
	mustLen("Upload", len(src), len(d))
	copy(d, src)
}

// UploadInt32 implements tensor.Backend.
func (*Backend) UploadInt32(dst tensor.Buffer, src []int32) {
	d := i32(dst)
	mustLen("UploadInt32", len(src), len(d))
	copy(d, src)
}

// Download implements tensor.Backend.
func (*Backend) Download(dst []float32, src tensor.Buffer) {
	if src.DType() == tensor.BFloat16 {
		s := bf16(src)
		mustLen("Download", len(dst), len(s))
		for i, h := range s {
			dst[i] = safetensors.BF16ToFloat32(h)
		}
		return
	}
	s := f32(src)
	mustLen("Download", len(dst), len(s))
	copy(dst, s)
}

// Sync implements tensor.Backend; host work is already done.
func (*Backend) Sync() error { return nil }

// Gemm implements tensor.Backend. B may be bfloat16 (stored weights).
func (*Backend) Gemm(transA, transB bool, m, n, k int, alpha float32, a, b tensor.Buffer, beta float32, c tensor.Buffer) {
	af, cf := f32(a), f32(c)
	if m < 0 || n < 0 || k < 0 || len(af) != m*k || b.Len() != k*n || len(cf) != m*n {
		panic(fmt.Sprintf("cpu: Gemm %dx%dx%d with buffers a=%d b=%d c=%d", m, n, k, len(af), b.Len(), len(cf)))
	}
	if m == 0 || n == 0 {
		return
	}
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	if b.DType() == tensor.BFloat16 {
		gemm.SgemmBF16(transA, transB, m, n, k, alpha, af, max(lda, 1), bf16(b), max(ldb, 1), beta, cf, n)
		return
	}
	gemm.Sgemm(transA, transB, m, n, k, alpha, af, max(lda, 1), f32(b), max(ldb, 1), beta, cf, n)
}

func mustLen(op string, got, want int) {
	if got != want {
		panic(fmt.Sprintf("cpu: %s: length %d, want %d", op, got, want))
	}
}

func mustRows(op string, n, dim int) int {
	if dim <= 0 || n%dim != 0 {
		panic(fmt.Sprintf("cpu: %s: length %d is not a multiple of row width %d", op, n, dim))
	}
	return n / dim
}

// Work sizes below which an op stays on the calling goroutine.
const (
	grainElems = 1 << 15 // elementwise ops
	grainRowEl = 1 << 13 // row ops: rows·width per goroutine
	sumChunk   = 1 << 12 // fixed chunk of a reduction, independent of workers
)

// parallel runs f over [0,n) split into at most workers contiguous
// ranges of at least grain items each.
func (be *Backend) parallel(n, grain int, f func(lo, hi int)) {
	if n <= 0 {
		return
	}
	parts := min(be.workers, (n+grain-1)/max(grain, 1))
	if parts <= 1 {
		f(0, n)
		return
	}
	step := (n + parts - 1) / parts
	var wg sync.WaitGroup
	for lo := step; lo < n; lo += step {
		hi := min(lo+step, n)
		wg.Go(func() { f(lo, hi) })
	}
	f(0, min(step, n))
	wg.Wait()
}

// rowGrain is the number of rows of width dim worth one goroutine.
func rowGrain(dim int) int { return max(1, grainRowEl/max(dim, 1)) }
