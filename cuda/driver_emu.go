//go:build cudaemu

package cuda

import (
	"unsafe"

	"github.com/holopeer/holopeer/cuda/emu"
)

// NewEmulated returns a backend whose kernels run on the CPU emulator of
// package cuda/emu: the same kernel sources, launch arguments and Go code
// as on a GPU, for tests on machines without one. It is slow and is not
// registered as a tensor backend.
func NewEmulated() (*Backend, error) {
	return newBackend(emuDriver{}, "CUDA emulator on the CPU (cuda/emu)", 0)
}

// emuDriver runs everything synchronously, which is one valid order of a
// single stream.
type emuDriver struct{}

func (emuDriver) bind() error { return nil }
func (emuDriver) alloc(bytes int64) (devPtr, error) {
	p, err := emu.Alloc(bytes)
	return devPtr(p), err
}
func (emuDriver) free(p devPtr) error { return emu.Free(uintptr(p)) }
func (emuDriver) sync() error         { return nil }
func (emuDriver) close() error        { return nil }

func (emuDriver) memset32(p devPtr, v uint32, n int) error {
	emu.Memset32(uintptr(p), v, n)
	return nil
}

func (emuDriver) htod(dst devPtr, src unsafe.Pointer, bytes int64) error {
	emu.CopyIn(uintptr(dst), src, bytes)
	return nil
}

func (emuDriver) dtoh(dst unsafe.Pointer, src devPtr, bytes int64) error {
	emu.CopyOut(dst, uintptr(src), bytes)
	return nil
}

func (emuDriver) dtod(dst, src devPtr, bytes int64) error {
	emu.Copy(uintptr(dst), uintptr(src), bytes)
	return nil
}

func (emuDriver) launch(kernel string, grid [3]int, block, shmem int, args []uint64) error {
	return emu.Launch(kernel, grid, block, shmem, args)
}

func (emuDriver) sgemm(transA, transB bool, m, n, k int, alpha float32, a devPtr, lda int, b devPtr, ldb int, beta float32, c devPtr, ldc int) error {
	emu.Sgemm(transA, transB, m, n, k, alpha, uintptr(a), lda, uintptr(b), ldb, beta, uintptr(c), ldc)
	return nil
}
