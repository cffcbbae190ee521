package gemm

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// fallbackPeak assumes two 128-bit FMA pipes per core (8 f32 FMAs, 16 FLOP
// per cycle: typical of arm64 cores and older x86) at the clock that
// /proc/cpuinfo reports, or 2 GHz when it reports none.
func fallbackPeak() peakResult {
	ghz, src := 2.0, "assumed"
	if mhz := cpuinfoMHz(); mhz > 0 {
		ghz, src = mhz/1000, "from /proc/cpuinfo"
	}
	cores := runtime.GOMAXPROCS(0)
	peak := 16 * ghz * float64(cores)
	return peakResult{
		gflops: peak,
		method: fmt.Sprintf("assumed 16 FLOP/cycle per core × %d cores × %.2f GHz (%s); not measured on this build", cores, ghz, src),
	}
}

func cpuinfoMHz() float64 {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return mhz
		}
	}
	return 0
}
