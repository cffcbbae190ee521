package openblas

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/gemm"
)

// TestTuneCompare alternates single 1024³ calls of gemm.Sgemm, gonum and
// (with -tags openblas) OpenBLAS for GEMM_TUNE_SECONDS (default 60) and
// prints the best run of each: on a shared machine, alternating gives each
// the same chances at the quiet moments. GEMM_TUNE=1 only.
func TestTuneCompare(t *testing.T) {
	if os.Getenv("GEMM_TUNE") == "" {
		t.Skip("GEMM_TUNE not set")
	}
	dur := 60 * time.Second
	if s := os.Getenv("GEMM_TUNE_SECONDS"); s != "" {
		d, err := time.ParseDuration(s + "s")
		if err != nil {
			t.Fatal(err)
		}
		dur = d
	}
	const n = 1024
	rng := rand.New(rand.NewPCG(1, 2))
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = rng.Float32()*2-1, rng.Float32()*2-1
	}
	fs := map[string]gemm.SgemmFunc{"holopeer-" + gemm.Kernel(): gemm.Sgemm, "gonum": gemm.GonumSgemm}
	if f, ok := Func(); ok {
		fs["openblas"] = f
	}
	best := map[string]time.Duration{}
	runs := map[string]int{}
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		for name, f := range fs {
			s := time.Now()
			f(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
			d := time.Since(s)
			if best[name] == 0 || d < best[name] {
				best[name] = d
			}
			runs[name]++
		}
	}
	for name, d := range best {
		fmt.Printf("%-20s best of %4d: %6.1f GFLOP/s\n", name, runs[name], 2*float64(n*n*n)/d.Seconds()/1e9)
	}
}
