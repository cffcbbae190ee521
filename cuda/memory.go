//go:build cuda || cudaemu

package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/devmem"
	"github.com/holopeer/holopeer/stage/tensor/opcheck"
)

// buffer is device memory: a pool block of its own, or a view into one.
type buffer struct {
	be    *Backend
	ptr   devPtr // 0 for an empty buffer
	n     int
	dt    tensor.DType
	block int64   // bytes of the pool block; 0 for views and empty buffers
	root  *buffer // the allocation a view shares; nil for an allocation
	freed bool
}

func (b *buffer) Len() int            { return b.n }
func (b *buffer) DType() tensor.DType { return b.dt }

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
		panic(fmt.Sprintf("cuda: %s: buffer of type %T does not belong to this cuda backend", op, x))
	}
	if b.dt != dt {
		panic(fmt.Sprintf("cuda: %s: %s buffer expected, got %s", op, dt, b.dt))
	}
	if b.dead() {
		panic(fmt.Sprintf("cuda: %s: buffer used after Free", op))
	}
	return b
}

func (be *Backend) f32(op string, x tensor.Buffer) *buffer { return be.buf(op, x, tensor.Float32) }
func (be *Backend) i32(op string, x tensor.Buffer) *buffer { return be.buf(op, x, tensor.Int32) }

// blockSize rounds an allocation up to a pool block. Blocks that come back
// to the pool are reused without a cuMemAlloc, which synchronises the
// device.
func blockSize(bytes int64) int64 { return devmem.BlockSize(bytes) }

// check panics on a call that cannot be right, before anything is queued.
const check = opcheck.Checker("cuda")

// allocLocked returns a block of size bytes (a multiple of
// devmem.BlockAlign), from the pool when one is free. When the device is
// full it frees the pool and tries once more, then panics: Alloc has no
// error to return, and a stage that does not fit must not run on garbage.
func (be *Backend) allocLocked(size int64) devPtr {
	if p, ok := be.pool.Take(size); ok {
		return p
	}
	p, err := be.drv.alloc(size)
	if err != nil {
		be.releaseCachedLocked()
		p, err = be.drv.alloc(size)
	}
	if err != nil {
		live, _ := be.pool.Stats()
		panic(fmt.Sprintf("cuda: allocating %d bytes on %s (%d in use): %v", size, be.desc, live, err))
	}
	be.pool.Allocated(size)
	return p
}

// freeLocked returns a block to the pool. Work queued on the stream that
// still reads it runs before any later user of the block, which is queued
// behind it on the same stream.
func (be *Backend) freeLocked(p devPtr, size int64) { be.pool.Put(p, size) }

// releaseCachedLocked gives every pooled block back to the driver.
func (be *Backend) releaseCachedLocked() {
	be.pool.Drain(func(p devPtr) {
		if err := be.drv.free(p); err != nil {
			be.failLocked("freeing device memory", err)
		}
	})
}

// ReleaseCached returns the memory pool's free blocks to the driver.
func (be *Backend) ReleaseCached() {
	defer be.lock()()
	be.releaseCachedLocked()
}

// MemStats reports the bytes of device memory held by live buffers and
// kept in the pool for reuse.
func (be *Backend) MemStats() (live, cached int64) {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.pool.Stats()
}

// Alloc implements tensor.Backend.
func (be *Backend) Alloc(dt tensor.DType, n int) tensor.Buffer {
	check.Alloc(dt, n)
	b := &buffer{be: be, n: n, dt: dt}
	if n == 0 {
		return b
	}
	b.block = blockSize(4 * int64(n))
	defer be.lock()()
	b.ptr = be.allocLocked(b.block)
	if err := be.drv.memset32(b.ptr, 0, n); err != nil {
		be.failLocked("clearing a buffer", err)
	}
	return b
}

// Free implements tensor.Backend.
func (be *Backend) Free(x tensor.Buffer) {
	b, ok := x.(*buffer)
	if !ok || b.be != be {
		panic(fmt.Sprintf("cuda: Free: buffer of type %T does not belong to this cuda backend", x))
	}
	if b.root != nil || b.freed {
		return
	}
	b.freed = true
	if b.block == 0 {
		return
	}
	defer be.lock()()
	be.freeLocked(b.ptr, b.block)
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
		v.ptr = b.ptr + devPtr(4*off)
	}
	return v
}

// Upload implements tensor.Backend.
func (be *Backend) Upload(dst tensor.Buffer, src []float32) {
	d := be.f32("Upload", dst)
	check.Len("Upload", len(src), d.n)
	be.upload(d, unsafe.Pointer(unsafe.SliceData(src)))
}

// UploadInt32 implements tensor.Backend.
func (be *Backend) UploadInt32(dst tensor.Buffer, src []int32) {
	d := be.i32("UploadInt32", dst)
	check.Len("UploadInt32", len(src), d.n)
	be.upload(d, unsafe.Pointer(unsafe.SliceData(src)))
}

func (be *Backend) upload(d *buffer, src unsafe.Pointer) {
	if d.n == 0 {
		return
	}
	defer be.lock()()
	// Synchronous from pageable memory: src may be reused on return, and
	// the copy is ordered after the work already queued.
	if err := be.drv.htod(d.ptr, src, 4*int64(d.n)); err != nil {
		be.failLocked("copying to the device", err)
	}
}

// Download implements tensor.Backend. It waits for the work queued before
// it.
func (be *Backend) Download(dst []float32, src tensor.Buffer) {
	s := be.f32("Download", src)
	check.Len("Download", len(dst), s.n)
	if s.n == 0 {
		return
	}
	defer be.lock()()
	if err := be.drv.dtoh(unsafe.Pointer(unsafe.SliceData(dst)), s.ptr, 4*int64(s.n)); err != nil {
		be.failLocked("copying from the device", err)
	}
}

// downloadF64Locked copies n float64 values from device memory; it waits
// for the work queued before it.
func (be *Backend) downloadF64Locked(p devPtr, n int) []float64 {
	out := make([]float64, n)
	if err := be.drv.dtoh(unsafe.Pointer(unsafe.SliceData(out)), p, 8*int64(n)); err != nil {
		be.failLocked("copying from the device", err)
	}
	return out
}

// Sync implements tensor.Backend: it waits for the device and reports the
// first device failure (for good: a CUDA context that faulted
// stays unusable), and any out-of-range ids, targets or positions that
// kernels met since the last Sync.
func (be *Backend) Sync() error {
	defer be.lock()()
	if err := be.drv.sync(); err != nil {
		be.failLocked("synchronising", err)
	}
	if be.err != nil {
		return be.err
	}
	var word uint32
	if err := be.drv.dtoh(unsafe.Pointer(&word), be.errWord, 4); err != nil {
		be.failLocked("copying from the device", err)
		return be.err
	}
	if word == 0 {
		return nil
	}
	if err := be.drv.memset32(be.errWord, 0, 1); err != nil {
		be.failLocked("clearing the error word", err)
	}
	return errBitsError(word)
}

// ErrBadIndex is reported by Sync when a kernel met an id, target or
// position outside its table; the offending rows were skipped (Gather and
// SoftmaxCrossEntropy zero them).
var ErrBadIndex = errors.New("cuda: index out of range")

func errBitsError(word uint32) error {
	return fmt.Errorf("%w: %v", ErrBadIndex, opcheck.IndexErrors(word))
}
