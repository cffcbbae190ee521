//go:build amd64 && !purego

package gemm

import "golang.org/x/sys/cpu"

//go:generate go run ./internal/kerngen -o .

//go:noescape
func kernAVX512(k int, a, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func kernAVX2(k int, a, b, c *float32, ldc int, alpha, beta float32)

// dot4AVX2 sets out[j] = Σ_{q<k} a[q]·b[j·ldb+q] for j < 4; k % 8 == 0.
//
//go:noescape
func dot4AVX2(k int, a, b *float32, ldb int, out *float32)

//go:noescape
func kernAVX512B(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)

//go:noescape
func kernAVX2B(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)

// The blocking (in avx512Geometry, avx2Geometry) for Zen 4/5 and recent
// Intel cores (48 KiB L1d, 1–2 MiB L2): a kc=256 B micro-panel is 32 KiB
// (AVX-512) or 16 KiB (AVX2) and stays in L1 while A micro-panels stream
// from L2; mc·kc of A is well inside L2. The AVX2 values also suit Zen 3
// (32 KiB L1d, 512 KiB L2), where they were measured.
var (
	avx512Kernel = withRun(avx512Geometry, kernAVX512, kernAVX512B)
	avx2Kernel   = withRun(avx2Geometry, kernAVX2, kernAVX2B)
)

func withRun(g microKernel, run func(k int, a, b, c *float32, ldc int, alpha, beta float32), runB func(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)) *microKernel {
	g.run, g.runB = run, runB
	return &g
}

func init() {
	// x/sys/cpu reports AVX-512 and AVX only when the OS saves the wider
	// register state too, so these flags are safe to act on.
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		avx512Kernel.dot4 = dot4AVX2
		avx2Kernel.dot4 = dot4AVX2
	}
	if cpu.X86.HasAVX512F && kernelWorks(avx512Kernel) {
		kernels = append(kernels, avx512Kernel)
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && kernelWorks(avx2Kernel) {
		kernels = append(kernels, avx2Kernel)
	}
	kernels = append(kernels, genericKernel)
}
