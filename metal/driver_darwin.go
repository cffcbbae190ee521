//go:build darwin && cgo && metal

package metal

/*
#cgo CFLAGS: -x objective-c -fobjc-arc
#cgo LDFLAGS: -framework Metal -framework Foundation
#include <stdlib.h>
#include <string.h>
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/holopeer/holopeer/stage/tensor"
)

// shared is the process's backend, opened once: the stages of one process
// share it and its buffer pool.
var shared = sync.OnceValues(func() (*Backend, error) { return New() })

func init() {
	tensor.Register("metal", Priority, func() (tensor.Backend, error) {
		be, err := shared()
		if err != nil {
			return nil, err
		}
		return be, nil
	})
}

// Available reports whether this binary can use Metal: it was built for
// macOS with cgo and the metal tag. Whether a device is present, Open says.
func Available() bool { return true }

// New opens the system's default Metal device and compiles the kernels.
// Without a device it returns an error wrapping ErrUnavailable.
func New() (*Backend, error) {
	src := C.CString(Source())
	defer C.free(unsafe.Pointer(src))
	names := make([]*C.char, len(kernelNames))
	for i, n := range kernelNames {
		names[i] = C.CString(n)
	}
	defer func() {
		for _, p := range names {
			C.free(unsafe.Pointer(p))
		}
	}()
	var errBuf [2048]C.char
	var noDevice C.int
	h := C.hp_mtl_open(src, &names[0], C.int(len(names)), &noDevice, &errBuf[0], C.int(len(errBuf)))
	if h == nil {
		msg := C.GoString(&errBuf[0])
		if noDevice != 0 {
			return nil, fmt.Errorf("%w: %s", ErrUnavailable, msg)
		}
		return nil, errors.New("metal: " + msg)
	}
	d := &mtlDriver{h: h}
	for k, name := range kernelNames {
		if w := int(C.hp_mtl_simd_width(h, C.int(k))); w != simdWidth {
			d.close()
			return nil, fmt.Errorf("metal: %s runs in SIMD groups of %d; the kernels need %d", name, w, simdWidth)
		}
	}
	var nameBuf [256]C.char
	mem := int64(C.hp_mtl_describe(h, &nameBuf[0], C.int(len(nameBuf))))
	desc := fmt.Sprintf("%s (%.1f GiB working set)", C.GoString(&nameBuf[0]), float64(mem)/(1<<30))
	be, err := newBackend(d, desc, mem)
	if err != nil {
		d.close()
		return nil, err
	}
	return be, nil
}

// mtlDriver is Metal through bridge.m.
type mtlDriver struct {
	h unsafe.Pointer // HPMetal
}

func (d *mtlDriver) alloc(bytes int64) (handle, error) {
	b := C.hp_mtl_alloc(d.h, C.int64_t(bytes))
	if b == nil {
		return 0, fmt.Errorf("newBufferWithLength %d failed", bytes)
	}
	return handle(uintptr(b)), nil
}

// ptr turns a handle back into the retained object pointer it is.
func ptr(h handle) unsafe.Pointer {
	u := uintptr(h)
	return *(*unsafe.Pointer)(unsafe.Pointer(&u))
}

func (d *mtlDriver) free(h handle) { C.hp_mtl_free(ptr(h)) }

func (d *mtlDriver) host(h handle) unsafe.Pointer { return C.hp_mtl_contents(ptr(h)) }

func (d *mtlDriver) write(h handle, off int64, src unsafe.Pointer, bytes int64) {
	C.memmove(unsafe.Add(d.host(h), off), src, C.size_t(bytes))
}

func (d *mtlDriver) read(dst unsafe.Pointer, h handle, off int64, bytes int64) {
	C.memmove(dst, unsafe.Add(d.host(h), off), C.size_t(bytes))
}

func (d *mtlDriver) maxThreads(k int) int { return int(C.hp_mtl_max_threads(d.h, C.int(k))) }

func (d *mtlDriver) dispatch(k int, groups [3]int, threads int, bufs []bufRef, a *kernelArgs) error {
	// The handles and offsets go in C memory: a Go slice of pointers may
	// not be passed to C.
	n := len(bufs)
	cbufs := (*[64]unsafe.Pointer)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	coffs := (*[64]C.int64_t)(C.malloc(C.size_t(n) * 8))
	defer C.free(unsafe.Pointer(cbufs))
	defer C.free(unsafe.Pointer(coffs))
	for i, b := range bufs {
		cbufs[i] = ptr(b.h)
		coffs[i] = C.int64_t(b.off)
	}
	args := a.bytes()
	var errBuf [512]C.char
	if C.hp_mtl_dispatch(d.h, C.int(k), C.int(groups[0]), C.int(groups[1]), C.int(groups[2]), C.int(threads),
		&cbufs[0], &coffs[0], C.int(n), unsafe.Pointer(&args[0]), C.int(len(args)), &errBuf[0], C.int(len(errBuf))) != 0 {
		return errors.New(C.GoString(&errBuf[0]))
	}
	return nil
}

func (d *mtlDriver) flush() error {
	var errBuf [1024]C.char
	if C.hp_mtl_flush(d.h, &errBuf[0], C.int(len(errBuf))) != 0 {
		return errors.New(C.GoString(&errBuf[0]))
	}
	return nil
}

func (d *mtlDriver) close() error {
	if err := d.flush(); err != nil {
		C.hp_mtl_close(d.h)
		return err
	}
	C.hp_mtl_close(d.h)
	return nil
}
