//go:build cuda || cudaemu

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/devmem"
)

// devPtr is a device address.
type devPtr uintptr

// driver is what the backend needs of a device: the CUDA driver and cuBLAS
// (driver_cu.go, build tag cuda) or the CPU emulator of package cuda/emu
// (build tag cudaemu), which runs the same kernels so that the backend can
// be tested where no GPU is. Calls are made with the backend's lock held,
// on a locked OS thread after bind. Work is ordered as called: the
// asynchronous calls queue on one stream, and dtoh waits for what is
// queued before it.
type driver interface {
	bind() error // makes the device current on the calling OS thread
	alloc(bytes int64) (devPtr, error)
	free(p devPtr) error
	memset32(p devPtr, v uint32, n int) error // asynchronous
	htod(dst devPtr, src unsafe.Pointer, bytes int64) error
	dtoh(dst unsafe.Pointer, src devPtr, bytes int64) error
	dtod(dst, src devPtr, bytes int64) error // asynchronous
	launch(kernel string, grid [3]int, block, shmem int, args []uint64) error
	// sgemm is cublasSgemm: column-major, C = alpha·op(A)·op(B) + beta·C.
	sgemm(transA, transB bool, m, n, k int, alpha float32, a devPtr, lda int, b devPtr, ldb int, beta float32, c devPtr, ldc int) error
	sync() error
	close() error
}

// Backend runs tensor ops on one NVIDIA GPU. All device calls go through
// one mutex and one stream, so ops run in the order they are called,
// whichever goroutines call them.
type Backend struct {
	// Static after newBackend.
	drv      driver
	desc     string
	totalMem int64
	errWord  devPtr // uint32 of error bits that kernels set

	mu     sync.Mutex // serialises every device call and guards the fields below
	pool   devmem.Pool[devPtr]
	err    error // first device failure; sticky
	closed bool
}

// newBackend wraps an opened device.
func newBackend(drv driver, desc string, totalMem int64) (*Backend, error) {
	be := &Backend{drv: drv, desc: desc, totalMem: totalMem}
	unlock := be.lock()
	defer unlock()
	var err error
	if be.errWord, err = drv.alloc(4); err != nil {
		return nil, fmt.Errorf("allocating the error word: %w", err)
	}
	if err := drv.memset32(be.errWord, 0, 1); err != nil {
		return nil, fmt.Errorf("clearing the error word: %w", err)
	}
	return be, nil
}

// lock serialises a sequence of device calls on this backend and binds
// the device to the calling OS thread; call the returned function when
// done.
func (be *Backend) lock() func() {
	be.mu.Lock()
	if be.closed {
		be.mu.Unlock()
		panic("cuda: backend used after Close")
	}
	runtime.LockOSThread()
	if err := be.drv.bind(); err != nil {
		be.failLocked("binding the context", err)
	}
	return be.unlock
}

func (be *Backend) unlock() {
	runtime.UnlockOSThread()
	be.mu.Unlock()
}

// failLocked records the first failure for Sync to report.
func (be *Backend) failLocked(what string, err error) {
	if be.err == nil {
		be.err = fmt.Errorf("cuda: %s: %w", what, err)
	}
}

// Name implements tensor.Backend.
func (*Backend) Name() string { return "cuda" }

// Device describes the GPU, e.g. "NVIDIA H200 (compute 9.0, 139.8 GiB)".
func (be *Backend) Device() string { return be.desc }

// TotalMemory is the device's memory in bytes.
func (be *Backend) TotalMemory() int64 { return be.totalMem }

// Close frees the backend's device memory and releases the device.
// Buffers must not be used afterwards.
func (be *Backend) Close() error {
	unlock := be.lock()
	errs := []error{be.drv.sync()}
	be.releaseCachedLocked()
	errs = append(errs, be.drv.free(be.errWord))
	be.closed = true
	unlock()
	errs = append(errs, be.drv.close())
	return errors.Join(errs...)
}

var _ tensor.Backend = (*Backend)(nil)
