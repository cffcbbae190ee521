//go:build amd64 && !purego

package gemm

import "golang.org/x/sys/cpu"

//go:generate go run ./internal/kerngen -o .

//go:noescape
func kernAVX512(k int, a, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func kernAVX2(k int, a, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func kernAVX512B(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)

//go:noescape
func kernAVX2B(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)

// Blocking for the AVX-512 14×32 tile on Zen 5 (48 KiB L1d, 1 MiB L2 per
// core): a kc=256 B micro-panel is 32 KiB and stays in L1 while A
// micro-panels stream from L2; mc·kc of A is well inside L2.
var avx512Kernel = &microKernel{
	name: "avx512", mr: 14, nr: 32,
	kc: 256, mc: 168, nc: 4096,
	run: kernAVX512, runB: kernAVX512B,
}

var avx2Kernel = &microKernel{
	name: "avx2", mr: 6, nr: 16,
	kc: 256, mc: 144, nc: 4096,
	run: kernAVX2, runB: kernAVX2B,
}

func init() {
	// x/sys/cpu reports AVX-512 and AVX only when the OS saves the wider
	// register state too, so these flags are safe to act on.
	if cpu.X86.HasAVX512F && kernelWorks(avx512Kernel) {
		kernels = append(kernels, avx512Kernel)
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && kernelWorks(avx2Kernel) {
		kernels = append(kernels, avx2Kernel)
	}
	kernels = append(kernels, genericKernel)
}
