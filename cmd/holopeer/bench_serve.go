package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/pipeline/pipelinetest"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// The serve group measures generation through a swarm of three stage
// nodes on loopback in this process (real libp2p hosts, Noise links, the
// int8 codec) against single-process generation of the same checkpoint:
// tokens/s of one sequence, time to the first token, tokens/s of eight
// sequences at once, and the pause a stage node's death causes.
func init() {
	registerBench(benchGroup{Name: "serve", Run: benchServe})
}

func benchServe(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	cfg := train.DemoConfig(tokenizer.Byte().VocabSize())
	promptLen, newTokens, concurrent := 16, 64, 8
	if o.Quick {
		newTokens, concurrent = 24, 4
	}
	dir, err := os.MkdirTemp("", "holopeer-bench-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ck, err := benchCheckpoint(filepath.Join(dir, "ckpt"), cfg)
	if err != nil {
		return err
	}
	defer ck.Close()
	whole, err := ck.LoadStage(cfg, model.Whole(cfg), model.WithoutGrad())
	if err != nil {
		return err
	}
	defer whole.Close()
	local, err := serve.NewLocal(whole)
	if err != nil {
		return err
	}

	sw, err := pipelinetest.New(4, benchSwarmOptions()) // three stages and a spare
	if err != nil {
		return err
	}
	defer sw.Close()
	spec := job.Spec{
		JobID: job.NewJobID("bench-serve"), Name: "bench-serve", Kind: job.KindServe, Model: cfg, FromCheckpoint: true,
		Codec: "int8", Stages: 3, Replicas: 1, MaxBatch: 16, MaxTokens: cfg.MaxSeq,
	}
	srv, err := sw.Researcher().NewServer(pipeline.ServeConfig{Spec: spec, Weights: ck, Logger: quietLogger()}, sw.Client())
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = srv.Start(sctx)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Close(cctx)
	}()

	r := rand.New(rand.NewPCG(5, 6))
	prompt := func() []int32 {
		p := make([]int32, promptLen)
		for i := range p {
			p[i] = int32(r.IntN(256))
		}
		return p
	}
	// One sequence: tokens/s and time to first token, best of the runs.
	measure := func(eng serve.Engine) (tps, ttft float64, err error) {
		if _, _, err := timeGeneration(ctx, eng, prompt(), newTokens); err != nil { // warm-up
			return 0, 0, err
		}
		start := time.Now()
		ttft = 1e18
		for runs := 0; runs < 2 || time.Since(start) < o.Time; runs++ {
			d, first, err := timeGeneration(ctx, eng, prompt(), newTokens)
			if err != nil {
				return 0, 0, err
			}
			tps = max(tps, float64(newTokens)/d.Seconds())
			ttft = min(ttft, first.Seconds()*1e3)
		}
		return tps, ttft, nil
	}
	swarmTPS, swarmTTFT, err := measure(srv)
	if err != nil {
		return fmt.Errorf("swarm generation: %w", err)
	}
	localTPS, localTTFT, err := measure(local)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("demo model %.2fM params (d=%d, %d layers) over 3 stage nodes on loopback, int8 codec; %d-token prompt, %d new tokens, greedy; baseline: one process, same checkpoint",
		float64(cfg.ParamCount())/1e6, cfg.Dim, cfg.Layers, promptLen, newTokens)
	row1 := row("serve_tokens_per_s", swarmTPS, "tokens/s", localTPS)
	row1.Note = note
	emit(row1)
	row2 := row("serve_time_to_first_token_ms", swarmTTFT, "ms", localTTFT)
	row2.Note = note
	emit(row2)

	// Several sequences at once: the swarm batches them and keeps every
	// stage busy; one process runs them one after another.
	prompts := make([][]int32, concurrent)
	for i := range prompts {
		prompts[i] = prompt()
	}
	swarmAll, err := timeConcurrent(ctx, srv, prompts, newTokens)
	if err != nil {
		return err
	}
	localAll, err := timeConcurrent(ctx, local, prompts, newTokens)
	if err != nil {
		return err
	}
	row3 := row(fmt.Sprintf("serve_tokens_per_s_%d_concurrent", concurrent), swarmAll, "tokens/s", localAll)
	row3.Note = fmt.Sprintf("%d sequences of %d new tokens at once; baseline: one process generating them in turn", concurrent, newTokens)
	emit(row3)

	// A stage node dies mid-generation: the longest pause between tokens
	// against the median one.
	victim := srv.Stats().Plan.Stages[1].Replicas[0]
	var (
		at     []time.Time
		killed sync.Once
		done   = make(chan struct{})
	)
	err = srv.Generate(ctx, prompt(), newTokens, serve.NewSampler(serve.Sampling{}).Pick, func(int32) bool {
		at = append(at, time.Now())
		if len(at) == newTokens/2 {
			killed.Do(func() { go func() { _ = sw.Kill(victim); close(done) }() })
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("generation across a failover: %w", err)
	}
	<-done
	var gaps []float64
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]).Seconds()*1e3)
	}
	slices.Sort(gaps)
	row4 := row("serve_failover_pause_ms", gaps[len(gaps)-1], "ms", gaps[len(gaps)/2])
	st := srv.Stats()
	row4.Note = fmt.Sprintf("the middle stage's node killed after %d of %d tokens; a spare loads its blocks (re-plan to ready: %v) and the prefix is replayed; baseline: the median pause between tokens (%d recovery, %d tokens replayed)",
		newTokens/2, newTokens, st.LastRecovery.Round(time.Millisecond), st.Recoveries, st.Replayed)
	emit(row4)
	return nil
}

// timeGeneration generates n tokens greedily and returns the time taken
// and the time to the first token.
func timeGeneration(ctx context.Context, eng serve.Engine, prompt []int32, n int) (total, first time.Duration, err error) {
	start := time.Now()
	got := 0
	err = eng.Generate(ctx, prompt, n, serve.NewSampler(serve.Sampling{}).Pick, func(int32) bool {
		if got == 0 {
			first = time.Since(start)
		}
		got++
		return false
	})
	if err == nil && got != n {
		err = fmt.Errorf("%d of %d tokens generated", got, n)
	}
	return time.Since(start), first, err
}

// timeConcurrent generates for every prompt at once and returns the
// tokens per second of them all.
func timeConcurrent(ctx context.Context, eng serve.Engine, prompts [][]int32, n int) (float64, error) {
	start := time.Now()
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = timeGeneration(ctx, eng, p, n)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(len(prompts)*n) / time.Since(start).Seconds(), nil
}

// benchCheckpoint saves the demo model, seeded, as a checkpoint and opens
// it.
func benchCheckpoint(dir string, cfg model.Config) (*checkpoint.Checkpoint, error) {
	m, err := model.New(cfg, model.WithSeed(1))
	if err != nil {
		return nil, err
	}
	snap, err := checkpoint.Capture([]*model.Stage{m.Stage}, nil)
	m.Close()
	if err != nil {
		return nil, err
	}
	if err := checkpoint.Save(dir, snap, checkpoint.WithTokenizer(tokenizer.Byte())); err != nil {
		return nil, err
	}
	return checkpoint.Open(dir)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// benchSwarmOptions is the loopback swarm serving runs on: quiet, and the
// coordinator checks its nodes once a second.
func benchSwarmOptions() pipelinetest.Options {
	return pipelinetest.Options{Logger: quietLogger(), HealthInterval: time.Second}
}
