//go:build !amd64 && !386

package gemm

var genericKernel = generic4x4
