package main

import (
	"context"
	"fmt"

	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// The device group measures each GPU backend built into the binary that
// opens on this machine against the cpu backend in the same process: GEMM
// GFLOP/s (the figure a node offers) and training tokens/s of the demo
// model with every stage op on the device. It emits one row saying which
// backends it skipped and why, so a run without a GPU says so.
func init() {
	registerBench(benchGroup{Name: "device", Run: benchDevice})
}

func benchDevice(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	ref := cpu.New()
	cpuGF, err := measureGFLOPS(ctx, ref, gemmSize(ref, o.Quick), o.Time)
	if err != nil {
		return err
	}
	cfg := train.DemoConfig(tokenizer.Byte().VocabSize())
	batch, seq, minSteps := 16, 64, 3
	if o.Quick {
		batch, minSteps = 4, 2
	}
	var cpuTrain *train.Throughput
	measured := 0
	for _, name := range tensor.Backends() {
		if name == "cpu" {
			continue
		}
		be, err := tensor.Open(name)
		if err != nil {
			r := row("device_"+name+"_available", 0, "bool", 0)
			r.Note = err.Error()
			emit(r)
			continue
		}
		measured++
		n := gemmSize(be, o.Quick)
		gf, err := measureGFLOPS(ctx, be, n, o.Time)
		if err != nil {
			return err
		}
		r := row(fmt.Sprintf("device_%s_gemm_gflops", name), gf, "GFLOP/s", cpuGF)
		r.Note = fmt.Sprintf("%d³ float32 on %s; baseline: cpu backend at %d³, same process", n, describe(be), gemmSize(ref, o.Quick))
		emit(r)

		if cpuTrain == nil {
			m, err := train.Measure(ctx, cfg, ref, batch, seq, minSteps, o.Time)
			if err != nil {
				return err
			}
			cpuTrain = &m
		}
		m, err := train.Measure(ctx, cfg, be, batch, seq, minSteps, o.Time)
		if err != nil {
			return fmt.Errorf("training on %s: %w", name, err)
		}
		r = row(fmt.Sprintf("device_%s_train_tokens_per_s_demo", name), m.TokensPerSec, "tokens/s", cpuTrain.TokensPerSec)
		r.Note = fmt.Sprintf("demo model, steps of %d×%d tokens on %s, %.0f ms/step; baseline: the cpu backend", batch, seq, name, m.StepTime.Seconds()*1e3)
		emit(r)
	}
	if measured == 0 {
		r := row("device_gpu_backends_measured", 0, "count", 0)
		r.Note = "no GPU backend opened in this binary (the default build has none: -tags cuda or -tags metal)"
		emit(r)
	}
	return nil
}
