package gemm

import "testing"

// BenchmarkMicroKernel times each kernel alone on cache-resident panels:
// the ceiling the blocked driver can reach.
func BenchmarkMicroKernel(b *testing.B) {
	for _, kr := range kernels {
		b.Run(kr.name, func(b *testing.B) {
			k := kernelBenchK
			a := make([]float32, kr.mr*k)
			bb := make([]float32, kr.nr*k)
			c := make([]float32, kr.mr*kr.nr)
			for b.Loop() {
				kr.run(k, &a[0], &bb[0], &c[0], kr.nr, 1, 0)
			}
			b.ReportMetric(2*float64(kr.mr*kr.nr*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

var kernelBenchK = 256

// BenchmarkPack times packing a 144×256 block of A (the transposing
// gather) and of Bᵀ, per element.
func BenchmarkPack(b *testing.B) {
	for _, kr := range kernels {
		const rows, k = 144, 256
		src := make([]float32, rows*k)
		dst := make([]float32, roundUp(rows, kr.mr)*k)
		g := &args{m: rows, k: k, a: src, lda: k}
		b.Run("A/"+kr.name, func(b *testing.B) {
			for b.Loop() {
				packA(dst, kr.mr, g, 0, rows, 0, k)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows*k), "ns/elem")
		})
	}
}
