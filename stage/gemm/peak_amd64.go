//go:build amd64 && !purego

package gemm

import (
	"runtime"

	"golang.org/x/sys/cpu"
)

// addChain runs n iterations of 16 dependent ADDs (16 cycles each).
//
//go:noescape
func addChain(n int)

// fmaLoopAVX512 runs n iterations of 24 independent zmm FMAs.
//
//go:noescape
func fmaLoopAVX512(n int)

// fmaLoopAVX2 runs n iterations of 12 independent ymm FMAs.
//
//go:noescape
func fmaLoopAVX2(n int)

func measurePeak() peakResult {
	// Many short runs rather than a few long ones: on a shared machine a
	// short run is more likely to go by without being preempted.
	const reps = 50
	const addIters = 1 << 14 // 262144 cycles, about 80 µs at 3.3 GHz
	hz := bestOf(reps, 16*addIters, func() { addChain(addIters) })

	isa, lanes, chains, loop := "avx2+fma", 8, 12, fmaLoopAVX2
	switch {
	case cpu.X86.HasAVX512F:
		isa, lanes, chains, loop = "avx512", 16, 24, fmaLoopAVX512
	case cpu.X86.HasAVX2 && cpu.X86.HasFMA:
	default:
		return fallbackPeak()
	}
	const fmaIters = 1 << 14 // 100k to 200k cycles
	fmaPerSec := bestOf(reps, float64(chains*fmaIters), func() { loop(fmaIters) })
	oneCore := fmaPerSec * float64(lanes) * 2 / 1e9

	cores := runtime.GOMAXPROCS(0)
	// Longer runs here so that starting the goroutines is noise.
	const allIters = 1 << 17
	var all float64
	for range 10 {
		d := allCores(cores, func() { loop(allIters) })
		if r := float64(cores*chains*allIters) * float64(lanes) * 2 / d.Seconds() / 1e9; r > all {
			all = r
		}
	}
	// A noisy neighbour can only make the all-core run slower, and cores
	// cannot beat one core each; trust the all-core run only when it is
	// plausibly clean, else scale the one-core figure.
	peak := all
	if all < 0.75*oneCore*float64(cores) {
		peak = oneCore * float64(cores)
	}
	ghz := hz / 1e9
	return peakResult{
		gflops: peak,
		method: describePeak(isa, fmaPerSec/hz, lanes, cores, ghz, oneCore, all),
	}
}
