//go:build !amd64 || purego

package gemm

func init() { kernels = append(kernels, genericKernel) }
