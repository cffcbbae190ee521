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
