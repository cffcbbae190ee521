//go:build !amd64 || purego

package gemm

func measurePeak() peakResult { return fallbackPeak() }
