//go:build openblas && cgo

// Package openblas is OpenBLAS's cblas_sgemm behind gemm.Sgemm's
// signature, for benchmark comparison only. It needs cgo, the openblas
// build tag and libopenblas-dev; without them Func reports false, so the
// default build stays free of cgo and the binary static. (It is a separate
// package because Go does not allow cgo in a package with Go assembly.)
package openblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import (
	"runtime"

	"github.com/holopeer/holopeer/stage/gemm"
	"unsafe"
)

// Func returns OpenBLAS's cblas_sgemm behind Sgemm's signature, using
// GOMAXPROCS threads, and true. It exists only with the openblas build tag
// (cgo, libopenblas-dev) as a benchmark comparison; the default build has no
// cgo so that the binary stays static.
func Func() (gemm.SgemmFunc, bool) { return sgemm, true }

func sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	ta, tb := uint32(C.CblasNoTrans), uint32(C.CblasNoTrans)
	if transA {
		ta = C.CblasTrans
	}
	if transB {
		tb = C.CblasTrans
	}
	C.openblas_set_num_threads(C.int(runtime.GOMAXPROCS(0)))
	C.cblas_sgemm(C.CblasRowMajor, ta, tb, C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), first(a), C.blasint(lda), first(b), C.blasint(ldb),
		C.float(beta), first(c), C.blasint(ldc))
}

func first(x []float32) *C.float {
	if len(x) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&x[0]))
}
