//go:build (cudaemu || metalemu) && linux && amd64

package emu

/*
#cgo CXXFLAGS: -std=c++17 -O2 -Wno-unknown-pragmas -Wno-attributes -I${SRCDIR} -I${SRCDIR}/../kernels
#include <stdlib.h>
#include "emu.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Alloc returns bytes of zeroed memory that ends at an inaccessible page.
func Alloc(bytes int64) (uintptr, error) {
	p := uintptr(C.hp_emu_alloc(C.int64_t(bytes)))
	if p == 0 {
		return 0, fmt.Errorf("emu: cannot map %d bytes", bytes)
	}
	return p, nil
}

// Free releases memory from Alloc.
func Free(p uintptr) error {
	if C.hp_emu_free(C.uintptr_t(p)) != 0 {
		return fmt.Errorf("emu: free of %#x, which Alloc did not return", p)
	}
	return nil
}

// Memset32 sets n 32-bit words at p to v.
func Memset32(p uintptr, v uint32, n int) {
	C.hp_emu_memset32(C.uintptr_t(p), C.uint32_t(v), C.int64_t(n))
}

// CopyIn copies bytes of host memory to p.
func CopyIn(p uintptr, src unsafe.Pointer, bytes int64) {
	C.hp_emu_copy_in(C.uintptr_t(p), src, C.int64_t(bytes))
}

// CopyOut copies bytes at p to host memory.
func CopyOut(dst unsafe.Pointer, p uintptr, bytes int64) {
	C.hp_emu_copy_out(dst, C.uintptr_t(p), C.int64_t(bytes))
}

// Copy copies bytes between emulator allocations.
func Copy(dst, src uintptr, bytes int64) {
	C.hp_emu_copy(C.uintptr_t(dst), C.uintptr_t(src), C.int64_t(bytes))
}

// Launch runs kernel to completion over grid with 1-D blocks, its
// arguments in 8-byte slots as cuLaunchKernel's caller passes them.
func Launch(kernel string, grid [3]int, block, shmem int, args []uint64) error {
	ck := C.CString(kernel)
	defer C.free(unsafe.Pointer(ck))
	var errBuf [512]C.char
	var argp *C.uint64_t
	if len(args) > 0 {
		argp = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	if C.hp_emu_launch(ck, C.int(grid[0]), C.int(grid[1]), C.int(grid[2]), C.int(block), C.int(shmem),
		argp, C.int(len(args)), &errBuf[0], C.int(len(errBuf))) != 0 {
		return errors.New("emu: " + C.GoString(&errBuf[0]))
	}
	return nil
}

// Kernels lists the kernels compiled into the emulator.
func Kernels() []string {
	n := int(C.hp_emu_kernel_count())
	out := make([]string, n)
	for i := range out {
		out[i] = C.GoString(C.hp_emu_kernel_name(C.int(i)))
	}
	return out
}

// Sgemm is cublasSgemm's arithmetic on emulator memory: column-major,
// C = alpha·op(A)·op(B) + beta·C.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, b uintptr, ldb int, beta float32, c uintptr, ldc int) {
	C.hp_emu_sgemm(cbool(transA), cbool(transB), C.int(m), C.int(n), C.int(k), C.float(alpha), C.uintptr_t(a), C.int(lda),
		C.uintptr_t(b), C.int(ldb), C.float(beta), C.uintptr_t(c), C.int(ldc))
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
