//go:build metalemu

package metal

import (
	"unsafe"

	"github.com/holopeer/holopeer/cuda/emu"
)

// NewEmulated returns a backend whose kernels, those of kernels.metal, run
// on the CPU emulator of package cuda/emu: the same Go code and dispatch
// arguments as on a Mac, for tests on machines without Metal. It is slow
// and is not registered as a tensor backend.
func NewEmulated() (*Backend, error) {
	args, err := emu.Alloc(int64(unsafe.Sizeof(kernelArgs{})))
	if err != nil {
		return nil, err
	}
	return newBackend(&emuDriver{args: args}, "Metal kernels on the CPU emulator (cuda/emu)", 0)
}

// emuDriver runs every dispatch at once, which is one valid order of a
// single command queue.
type emuDriver struct {
	args uintptr // the HpArgs of the dispatch being run
}

func (d *emuDriver) alloc(bytes int64) (handle, error) {
	p, err := emu.Alloc(bytes)
	return handle(p), err
}

func (d *emuDriver) free(h handle) { _ = emu.Free(uintptr(h)) }

func (d *emuDriver) write(h handle, off int64, src unsafe.Pointer, bytes int64) {
	emu.CopyIn(uintptr(h)+uintptr(off), src, bytes)
}

func (d *emuDriver) read(dst unsafe.Pointer, h handle, off int64, bytes int64) {
	emu.CopyOut(dst, uintptr(h)+uintptr(off), bytes)
}

// host converts the emulator's address, which is host memory it mapped.
func (d *emuDriver) host(h handle) unsafe.Pointer {
	u := uintptr(h)
	return *(*unsafe.Pointer)(unsafe.Pointer(&u))
}

func (d *emuDriver) maxThreads(int) int { return 1024 }

func (d *emuDriver) dispatch(kernel int, groups [3]int, threads int, bufs []bufRef, a *kernelArgs) error {
	slots := make([]uint64, len(bufs)+1)
	for i, b := range bufs {
		slots[i] = uint64(b.h) + uint64(b.off)
	}
	emu.CopyIn(d.args, unsafe.Pointer(a), int64(unsafe.Sizeof(*a)))
	slots[len(bufs)] = uint64(d.args)
	return emu.Launch("metal/"+kernelNames[kernel], groups, threads, 0, slots)
}

func (d *emuDriver) flush() error { return nil }

func (d *emuDriver) close() error { return emu.Free(d.args) }
