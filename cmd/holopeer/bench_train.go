package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// The train group measures the single-process reference on the demo model
// (train.DemoConfig over the byte vocabulary): training tokens/s on every
// core against the same run on one core, and KV-cached decoding tokens/s
// against decoding that recomputes the whole prefix for every token.
func init() {
	registerBench(benchGroup{Name: "train", Run: benchTrain})
}

func benchTrain(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	cfg := train.DemoConfig(tokenizer.Byte().VocabSize())
	batch, seq, minSteps := 16, 64, 3
	if o.Quick {
		batch, minSteps = 4, 2
	}
	threads := runtime.GOMAXPROCS(0)
	all, err := train.Measure(ctx, cfg, cpu.New(), batch, seq, minSteps, o.Time)
	if err != nil {
		return err
	}
	// The one-core baseline: GEMM sizes its worker pool from GOMAXPROCS,
	// so pin that too while it runs (the groups run one at a time).
	runtime.GOMAXPROCS(1)
	one, err := train.Measure(ctx, cfg, cpu.New(cpu.WithWorkers(1)), batch, seq, minSteps, o.Time)
	runtime.GOMAXPROCS(threads)
	if err != nil {
		return err
	}
	r := row("train_tokens_per_s_demo", all.TokensPerSec, "tokens/s", one.TokensPerSec)
	r.Note = fmt.Sprintf("demo model %.2fM params (d=%d, %d layers), steps of %d×%d tokens, %d threads, %.0f ms/step; baseline: the same on 1 thread (ratio = parallel speedup)",
		float64(all.Params)/1e6, cfg.Dim, cfg.Layers, batch, seq, threads, all.StepTime.Seconds()*1e3)
	emit(r)

	promptLen, newTokens := 16, 48
	if o.Quick {
		newTokens = 16
	}
	cached, full, err := measureDecode(ctx, cfg, promptLen, newTokens, o.Time)
	if err != nil {
		return err
	}
	r = row("generate_tokens_per_s_demo", cached, "tokens/s", full)
	r.Note = fmt.Sprintf("greedy decoding of %d tokens after a %d-token prompt, demo model; baseline: recomputing the whole prefix per token (ratio = KV-cache speedup)", newTokens, promptLen)
	emit(r)
	return nil
}

// measureDecode returns greedy decoding speed with the KV cache and by
// recomputing the prefix, in generated tokens per second.
func measureDecode(ctx context.Context, cfg model.Config, promptLen, newTokens int, minTime time.Duration) (cached, full float64, err error) {
	m, err := model.New(cfg, model.WithSeed(1))
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(3, 4))
	prompt := make([]int32, promptLen)
	for i := range prompt {
		prompt[i] = int32(r.IntN(256))
	}
	g := genConfig{maxTokens: newTokens}
	cached, err = timeRuns(ctx, minTime, newTokens, func() error {
		_, err := generate(m.Stage, prompt, g, nil)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	full, err = timeRuns(ctx, minTime, newTokens, func() error {
		seq := slices.Clone(prompt)
		var ids []int
		s := serve.NewSampler(g.sampling)
		for range newTokens {
			out, err := m.Forward(0, model.Input{Batch: 1, Seq: len(seq), Tokens: seq, NoGrad: true})
			if err != nil {
				return err
			}
			next := int(s.Pick(out.Logits[(len(seq)-1)*cfg.Vocab:]))
			ids = append(ids, next)
			seq = append(seq, int32(next))
		}
		_ = ids // the tests check that both ways pick the same tokens
		return nil
	})
	return cached, full, err
}

// timeRuns runs f at least twice and for at least minTime, and returns the
// units per second of the runs after the first.
func timeRuns(ctx context.Context, minTime time.Duration, units int, f func() error) (float64, error) {
	if err := f(); err != nil { // warm-up
		return 0, err
	}
	start := time.Now()
	runs := 0
	for runs < 1 || time.Since(start) < minTime {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		runs++
	}
	return float64(runs*units) / time.Since(start).Seconds(), nil
}
