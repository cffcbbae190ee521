//go:build unix

package gemm

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

var experimentKernels []*microKernel

// TestTuneKernels prints min-time GFLOP/s of each kernel, and of the
// variants `go run ./internal/kerngen -experiment` writes; only with
// GEMM_TUNE=1.
func TestTuneKernels(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	for _, kr := range append(experimentKernels, kernels...) {
		if !kernelWorks(kr) {
			t.Errorf("%s broken", kr.name)
			continue
		}
		for _, k := range []int{128, 256, 512} {
			a := make([]float32, kr.mr*k)
			bb := make([]float32, kr.nr*k)
			c := make([]float32, kr.mr*kr.nr)
			best := time.Hour
			for range 3000 {
				s := time.Now()
				for range 20 {
					kr.run(k, &a[0], &bb[0], &c[0], kr.nr, 1, 0)
				}
				best = min(best, time.Since(s))
			}
			fmt.Printf("%-16s k=%4d %6.1f GFLOP/s\n", kr.name, k, 20*2*float64(kr.mr*kr.nr*k)/best.Seconds()/1e9)
		}
	}
}

// TestTuneGemm prints the best of many 1024³ runs per kernel and thread
// count; only with GEMM_TUNE=1.
func TestTuneGemm(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	const n = 1024
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = float32(i%7)-3, float32(i%5)-2
	}
	for _, kr := range testKernels() {
		if kr.runB != nil && kr.name != "avx2" && kr.name != "avx512" {
			continue // Go stand-ins for the assembly geometry: not for speed
		}
		for _, th := range []int{1, 2} {
			withKernel(kr, th, func() {
				best := time.Hour
				reps := 25
				if kr.runB == nil {
					reps = 4
				}
				for range reps {
					s := time.Now()
					Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
					best = min(best, time.Since(s))
				}
				fmt.Printf("%s threads=%d best %.1f GFLOP/s\n", kernelLabel(kr), th, 2*float64(n*n*n)/best.Seconds()/1e9)
			})
		}
	}
	best := time.Hour
	for range 5 {
		s := time.Now()
		GonumSgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
		best = min(best, time.Since(s))
	}
	fmt.Printf("gonum best %.1f GFLOP/s\n", 2*float64(n*n*n)/best.Seconds()/1e9)
}

// TestTuneBlocking sweeps kc and mc for the default kernel at 1024³ on all
// cores and on one; only with GEMM_TUNE=1.
func TestTuneBlocking(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	const n = 1024
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = float32(i%7)-3, float32(i%5)-2
	}
	base := kernels[0]
	for _, kc := range []int{192, 256, 384, 512} {
		for _, mcTiles := range []int{8, 16, 24, 48} {
			kr := *base
			kr.kc, kr.mc = kc, mcTiles*kr.mr
			for _, th := range []int{1, 2} {
				withKernel(&kr, th, func() {
					best := time.Hour
					for range 10 {
						s := time.Now()
						Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
						best = min(best, time.Since(s))
					}
					fmt.Printf("kc=%d mc=%d threads=%d best %.1f GFLOP/s\n", kc, kr.mc, th, 2*float64(n*n*n)/best.Seconds()/1e9)
				})
			}
		}
	}
}

func bestTime(reps int, f func()) time.Duration {
	best := time.Hour
	for range reps {
		s := time.Now()
		f()
		best = min(best, time.Since(s))
	}
	return best
}

// TestTunePack prints the best per-element packing time; GEMM_TUNE=1 only.
func TestTunePack(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	for _, kr := range testKernels() {
		const rows, k = 144, 256
		src := make([]float32, 1024*k)
		dst := make([]float32, roundUp(rows, kr.mr)*k)
		g := &args{m: rows, k: k, a: src, lda: k, n: 1024, b: src, ldb: k, transB: true}
		d := bestTime(2000, func() { packA(dst, kr.mr, g, 0, rows, 0, k) })
		fmt.Printf("packA %-12s %.3f ns/elem\n", kernelLabel(kr), float64(d.Nanoseconds())/float64(rows*k))
		bdst := make([]float32, 1024*k)
		d = bestTime(300, func() { packB(bdst, kr.nr, g, 0, k, 0, 1024, 0, 1024/kr.nr) })
		fmt.Printf("packBT %-12s %.3f ns/elem\n", kernelLabel(kr), float64(d.Nanoseconds())/float64(1024*k))
		g.transB = false
		g.ldb = 1024
		d = bestTime(300, func() { packB(bdst, kr.nr, g, 0, k, 0, 1024, 0, 1024/kr.nr) })
		fmt.Printf("packB %-12s %.3f ns/elem\n", kernelLabel(kr), float64(d.Nanoseconds())/float64(1024*k))
		g.transB = true
		g.ldb = k
	}
}

// TestTuneShapes compares Sgemm with gonum on model-like shapes, best of
// several runs each; GEMM_TUNE=1 only.
func TestTuneShapes(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	for _, s := range shapesForTune([][3]int{{1, 4096, 1024}, {1, 1024, 4096}, {4, 4096, 1024}, {64, 8, 256}, {64, 256, 64}, {256, 256, 256}, {2048, 512, 64}, {1024, 1024, 1024}}) {
		m, n, k := s[0], s[1], s[2]
		a, b, c := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
		for i := range a {
			a[i] = float32(i%7) - 3.5
		}
		for i := range b {
			b[i] = float32(i%5) - 2.5
		}
		for tr := range 4 {
			tA, tB := tr&1 != 0, tr&2 != 0
			lda, ldb := k, n
			if tA {
				lda = m
			}
			if tB {
				ldb = k
			}
			reps := max(3, min(200, 1<<28/(m*n*k)))
			ours := bestTime(reps, func() { Sgemm(tA, tB, m, n, k, 1, a, lda, b, ldb, 0, c, n) })
			gon := bestTime(max(2, reps/4), func() { GonumSgemm(tA, tB, m, n, k, 1, a, lda, b, ldb, 0, c, n) })
			gf := func(d time.Duration) float64 { return 2 * float64(m*n*k) / d.Seconds() / 1e9 }
			fmt.Printf("%4dx%4dx%4d tA=%-5v tB=%-5v ours %6.1f gonum %6.1f GFLOP/s (%.1fx)\n", m, n, k, tA, tB, gf(ours), gf(gon), gf(ours)/gf(gon))
		}
	}
}

// TestTuneCPUTime reports GFLOP per CPU-second (user+sys) for 1 and 2
// threads: on a shared machine this shows the per-core efficiency that
// wall-clock numbers hide. GEMM_TUNE=1 only.
func TestTuneCPUTime(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	const n = 1024
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = float32(i%7)-3, float32(i%5)-2
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	type cfg struct{ kc, mc, th int }
	cfgs := []cfg{{256, 144, 1}, {512, 96, 1}, {384, 96, 1}, {256, 72, 1}, {128, 144, 1}, {256, 144, 2}, {512, 96, 2}}
	for _, cf := range cfgs {
		kr := *kernels[0]
		kr.kc, kr.mc = cf.kc, cf.mc
		th := cf.th
		withKernel(&kr, th, func() {
			Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
			c0, w0 := cpu(), time.Now()
			const reps = 20
			for range reps {
				Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
			}
			d := cpu() - c0
			fmt.Printf("kc=%d mc=%d threads=%d: %.1f GFLOP per CPU-second (per core), wall %.1f GFLOP/s\n", cf.kc, cf.mc, th, reps*2*float64(n*n*n)/d.Seconds()/1e9, reps*2*float64(n*n*n)/time.Since(w0).Seconds()/1e9)
		})
	}
}

// shapesForTune keeps the first GEMM_TUNE_SHAPES shapes when that is set.
func shapesForTune(all [][3]int) [][3]int {
	var n int
	if _, err := fmt.Sscan(os.Getenv("GEMM_TUNE_SHAPES"), &n); err == nil && n > 0 && n < len(all) {
		return all[:n]
	}
	return all
}
