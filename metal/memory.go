//go:build (darwin && cgo && metal) || metalemu

package metal

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/devmem"
	"github.com/holopeer/holopeer/stage/tensor/opcheck"
)

// buffer is a Metal buffer of its own, or a view into one.
type buffer struct {
	be    *Backend
	h     handle // 0 for an empty buffer
	off   int64  // bytes into h where the buffer starts
	n     int
	dt    tensor.DType
	block int64   // bytes of the pool block; 0 for views and empty buffers
	root  *buffer // the allocation a view shares; nil for an allocation
	freed bool
}

func (b *buffer) Len() int            { return b.n }
func (b *buffer) DType() tensor.DType { return b.dt }

func (b *buffer) ref() bufRef { return bufRef{b.h, b.off} }

func (b *buffer) dead() bool {
	if b.root != nil {
		return b.root.freed
	}
	return b.freed
}

// buf checks that x is a live buffer of this backend with dtype dt.
func (be *Backend) buf(op string, x tensor.Buffer, dt tensor.DType) *buffer {
	b, ok := x.(*buffer)
	if !ok || b.be != be {
		panic(fmt.Sprintf("metal: %s: buffer of type %T does not belong to this metal backend", op, x))
	}
	if b.dt != dt {
		panic(fmt.Sprintf("metal: %s: %s buffer expected, got %s", op, dt, b.dt))
	}
	if b.dead() {
		panic(fmt.Sprintf("metal: %s: buffer used after Free", op))
	}
	return b
}

func (be *Backend) f32(op string, x tensor.Buffer) *buffer { return be.buf(op, x, tensor.Float32) }
func (be *Backend) i32(op string, x tensor.Buffer) *buffer { return be.buf(op, x, tensor.Int32) }

// blockSize rounds an allocation up to a pool block; stages allocate the
// same shapes every microbatch, so blocks come back and are reused.
func blockSize(bytes int64) int64 { return devmem.BlockSize(bytes) }

// check panics on a call that cannot be right, before anything is queued.
const check = opcheck.Checker("metal")

// allocLocked returns a block of size bytes, from the pool when one is
// free. A block freed while queued work still uses it is safe to hand out:
// the command buffer holds the buffer, and Metal orders the later work
// after the earlier on the same queue. When the device is full it empties
// the pool and tries again, then panics: Alloc has no error to return.
func (be *Backend) allocLocked(size int64) handle {
	if h, ok := be.pool.Take(size); ok {
		return h
	}
	h, err := be.drv.alloc(size)
	if err != nil {
		be.flushLocked()
		be.releaseCachedLocked()
		h, err = be.drv.alloc(size)
	}
	if err != nil {
		live, _ := be.pool.Stats()
		panic(fmt.Sprintf("metal: allocating %d bytes on %s (%d in use): %v", size, be.desc, live, err))
	}
	be.pool.Allocated(size)
	return h
}

func (be *Backend) freeLocked(h handle, size int64) { be.pool.Put(h, size) }

func (be *Backend) releaseCachedLocked() { be.pool.Drain(be.drv.free) }

// ReleaseCached gives the pool's free buffers back to Metal.
func (be *Backend) ReleaseCached() {
	defer be.lock()()
	be.flushLocked()
	be.releaseCachedLocked()
}

// MemStats reports the bytes held by live buffers and kept in the pool.
func (be *Backend) MemStats() (live, cached int64) {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.pool.Stats()
}

// Alloc implements tensor.Backend. The zero fill is a queued kernel.
func (be *Backend) Alloc(dt tensor.DType, n int) tensor.Buffer {
	check.Alloc(dt, n)
	if n > maxElems {
		panic(fmt.Sprintf("metal: %d elements are more than the kernels index (%d)", n, maxElems))
	}
	b := &buffer{be: be, n: n, dt: dt}
	if n == 0 {
		return b
	}
	b.block = blockSize(4 * int64(n))
	defer be.lock()()
	b.h = be.allocLocked(b.block)
	be.dispatch1DLocked(kernelFill, n, []bufRef{b.ref()}, &kernelArgs{i: [8]int32{int32(n)}})
	return b
}

// Free implements tensor.Backend.
func (be *Backend) Free(x tensor.Buffer) {
	b, ok := x.(*buffer)
	if !ok || b.be != be {
		panic(fmt.Sprintf("metal: Free: buffer of type %T does not belong to this metal backend", x))
	}
	if b.root != nil || b.freed {
		return
	}
	b.freed = true
	if b.block == 0 {
		return
	}
	defer be.lock()()
	be.freeLocked(b.h, b.block)
}

// View implements tensor.Backend.
func (be *Backend) View(x tensor.Buffer, off, n int) tensor.Buffer {
	b := be.buf("View", x, x.DType())
	check.View(off, n, b.n)
	root := b
	if b.root != nil {
		root = b.root
	}
	v := &buffer{be: be, n: n, dt: b.dt, root: root}
	if n > 0 {
		v.h, v.off = b.h, b.off+4*int64(off)
	}
	return v
}

// Upload implements tensor.Backend: it waits for queued work (which may
// still use the buffer), then copies into the buffer's unified memory.
func (be *Backend) Upload(dst tensor.Buffer, src []float32) {
	d := be.f32("Upload", dst)
	check.Len("Upload", len(src), d.n)
	be.write(d, unsafe.Pointer(unsafe.SliceData(src)))
}

// UploadInt32 implements tensor.Backend.
func (be *Backend) UploadInt32(dst tensor.Buffer, src []int32) {
	d := be.i32("UploadInt32", dst)
	check.Len("UploadInt32", len(src), d.n)
	be.write(d, unsafe.Pointer(unsafe.SliceData(src)))
}

func (be *Backend) write(d *buffer, src unsafe.Pointer) {
	if d.n == 0 {
		return
	}
	defer be.lock()()
	be.flushLocked()
	be.drv.write(d.h, d.off, src, 4*int64(d.n))
}

// Download implements tensor.Backend: it waits for queued work, then
// copies from the buffer's unified memory.
func (be *Backend) Download(dst []float32, src tensor.Buffer) {
	s := be.f32("Download", src)
	check.Len("Download", len(dst), s.n)
	if s.n == 0 {
		return
	}
	defer be.lock()()
	be.flushLocked()
	be.drv.read(unsafe.Pointer(unsafe.SliceData(dst)), s.h, s.off, 4*int64(s.n))
}

// HostSlice returns b's memory as the CPU sees it, without a copy: Metal
// buffers live in unified memory. It waits for queued work first; the
// slice is valid until the next op on b or its Free.
func (be *Backend) HostSlice(x tensor.Buffer) []float32 {
	b := be.f32("HostSlice", x)
	if b.n == 0 {
		return nil
	}
	defer be.lock()()
	be.flushLocked()
	return unsafe.Slice((*float32)(unsafe.Add(be.drv.host(b.h), b.off)), b.n)
}

// Sync implements tensor.Backend: it waits for the queued work and reports
// the first failed command buffer (for good), and any out-of-range ids,
// targets or positions that kernels met since the last Sync.
func (be *Backend) Sync() error {
	defer be.lock()()
	be.flushLocked()
	if be.err != nil {
		return be.err
	}
	var word uint32
	be.drv.read(unsafe.Pointer(&word), be.errWord, 0, 4)
	if word == 0 {
		return nil
	}
	var zero uint32
	be.drv.write(be.errWord, 0, unsafe.Pointer(&zero), 4)
	return errBitsError(word)
}

// ErrBadIndex is reported by Sync when a kernel met an id, target or
// position outside its table; the offending rows were skipped (Gather and
// SoftmaxCrossEntropy zero them).
var ErrBadIndex = errors.New("metal: index out of range")

func errBitsError(word uint32) error {
	return fmt.Errorf("%w: %v", ErrBadIndex, opcheck.IndexErrors(word))
}
