//go:build !openblas || !cgo

// Package openblas is OpenBLAS's cblas_sgemm behind gemm.Sgemm's
// signature, for benchmark comparison only. This build has no OpenBLAS:
// build with -tags openblas (and cgo, libopenblas-dev) to get it.
package openblas

import "github.com/holopeer/holopeer/stage/gemm"

// Func reports that this build has no OpenBLAS.
func Func() (gemm.SgemmFunc, bool) { return nil, false }
