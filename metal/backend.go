//go:build (darwin && cgo && metal) || metalemu

package metal

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/devmem"
)

// handle is a device buffer: a retained id<MTLBuffer>, or an emulator
// address.
type handle uintptr

// bufRef binds a buffer at a byte offset (a view) to a kernel argument.
type bufRef struct {
	h   handle
	off int64
}

// kernelArgs are a kernel's scalars, HpArgs in kernels.metal.
type kernelArgs struct {
	i [8]int32
	f [8]float32
}

func (a *kernelArgs) bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(a)), unsafe.Sizeof(*a))
}

// driver is what the backend needs of a Metal device: the Objective-C
// bridge (driver_darwin.go) or cuda/emu running kernels.metal as C++
// (driver_emu.go, build tag metalemu). Calls are made with the backend's
// lock held. dispatch queues work; flush waits for everything queued and
// reports a failed command buffer. Buffer memory is unified: read and
// write reach it directly and are only safe after a flush.
type driver interface {
	alloc(bytes int64) (handle, error)
	free(h handle)
	write(h handle, off int64, src unsafe.Pointer, bytes int64)
	read(dst unsafe.Pointer, h handle, off int64, bytes int64)
	// host is the buffer's memory as the CPU sees it.
	host(h handle) unsafe.Pointer
	maxThreads(kernel int) int
	dispatch(kernel int, groups [3]int, threads int, bufs []bufRef, args *kernelArgs) error
	flush() error
	close() error
}

// Backend runs tensor ops on an Apple GPU. All device calls go through one
// mutex and one command queue, so ops run in the order they are called,
// whichever goroutines call them.
type Backend struct {
	// Static after newBackend.
	drv     driver
	desc    string
	memory  int64
	errWord handle // uint32 of error bits that kernels set

	mu     sync.Mutex // serialises every device call and guards the fields below
	pool   devmem.Pool[handle]
	err    error // first device failure; sticky
	closed bool
}

func newBackend(drv driver, desc string, memory int64) (*Backend, error) {
	for k, want := range map[int]int{kernelGemm: gemmThreads, kernelAttnForward: attnThreads,
		kernelAttnBackwardQ: attnThreads, kernelAttnBackwardKV: attnThreads} {
		if got := drv.maxThreads(k); got < want {
			return nil, fmt.Errorf("metal: %s runs at most %d threads per threadgroup, it needs %d", kernelNames[k], got, want)
		}
	}
	be := &Backend{drv: drv, desc: desc, memory: memory}
	var err error
	if be.errWord, err = drv.alloc(4); err != nil {
		return nil, fmt.Errorf("metal: allocating the error word: %w", err)
	}
	var zero uint32
	drv.write(be.errWord, 0, unsafe.Pointer(&zero), 4)
	return be, nil
}

func (be *Backend) lock() func() {
	be.mu.Lock()
	if be.closed {
		be.mu.Unlock()
		panic("metal: backend used after Close")
	}
	return be.mu.Unlock
}

// failLocked records the first failure for Sync to report.
func (be *Backend) failLocked(what string, err error) {
	if be.err == nil {
		be.err = fmt.Errorf("metal: %s: %w", what, err)
	}
}

// flushLocked waits for the queued work.
func (be *Backend) flushLocked() {
	if err := be.drv.flush(); err != nil {
		be.failLocked("command buffer", err)
	}
}

// Name implements tensor.Backend.
func (*Backend) Name() string { return "metal" }

// Device describes the GPU, e.g. "Apple M2 Pro (21.3 GiB working set)".
func (be *Backend) Device() string { return be.desc }

// Memory is the working set Metal recommends for the device, in bytes.
func (be *Backend) Memory() int64 { return be.memory }

// Close waits for queued work and releases the backend's buffers and
// pipelines. Buffers must not be used afterwards.
func (be *Backend) Close() error {
	unlock := be.lock()
	errs := []error{be.drv.flush()}
	be.releaseCachedLocked()
	be.drv.free(be.errWord)
	be.closed = true
	unlock()
	errs = append(errs, be.drv.close())
	return errors.Join(errs...)
}

var _ tensor.Backend = (*Backend)(nil)
