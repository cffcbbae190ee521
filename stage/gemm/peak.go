package gemm

import (
	"fmt"
	"runtime"
	"sync"
	"time"
)

// PeakGFLOPS estimates this machine's f32 peak in GFLOP/s with every
// GOMAXPROCS core busy, and says how it was found.
//
// Method (amd64): peak = FMA instructions per cycle × vector lanes × 2 FLOP
// × cores × clock, every factor measured rather than looked up:
//   - the clock comes from a chain of dependent integer ADDs, which retire
//     one per cycle on every x86 core, timed on one thread;
//   - FMAs per cycle come from a loop of independent FMAs on the widest
//     vectors the CPU has (more chains than pipes × latency), timed the same
//     way and divided by the clock;
//   - the all-core figure is that loop run on every core at once, so SMT
//     siblings sharing FMA units or an all-core clock lower than the
//     one-core boost count as they really are.
//
// Each loop is timed several times and the fastest run kept, because other
// processes share the cores. The result is cached after the first call.
// Elsewhere (other architectures, purego builds) there is no timing loop
// the compiler cannot rewrite, so the estimate assumes 16 FLOP per cycle
// per core at the clock /proc/cpuinfo shows, and the text says so.
func PeakGFLOPS() (float64, string) {
	r := peakOnce()
	return r.gflops, r.method
}

type peakResult struct {
	gflops float64
	method string
}

var peakOnce = sync.OnceValue(measurePeak)

// bestOf runs f (which does `work` operations) reps times and returns the
// highest rate in operations per second.
func bestOf(reps int, work float64, f func()) float64 {
	var best float64
	for range reps {
		t := time.Now()
		f()
		if r := work / time.Since(t).Seconds(); r > best {
			best = r
		}
	}
	return best
}

// allCores runs f on n goroutines locked to their own threads, started
// together, and returns the wall time of the slowest.
func allCores(n int, f func()) time.Duration {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			defer done.Done()
			ready.Done()
			<-start
			f()
		}()
	}
	ready.Wait()
	t := time.Now()
	close(start)
	done.Wait()
	return time.Since(t)
}

func describePeak(isa string, fmaPerCycle float64, lanes, cores int, ghz, oneCore, all float64) string {
	return fmt.Sprintf("%s: measured %.2f FMA/cycle × %d lanes × 2 FLOP at %.2f GHz = %.0f GFLOP/s per core; all %d cores together measured %.0f GFLOP/s",
		isa, fmaPerCycle, lanes, ghz, oneCore, cores, all)
}
