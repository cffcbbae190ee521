package main

import (
	"context"
	"fmt"
	"time"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/pipeline/pipelinetest"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// The swarm group trains the demo job (testnet/demo.yaml, with 4 stages)
// through a swarm of real libp2p hosts on loopback in this process, and
// the same model with the single-process trainer: tokens/s of each and
// their ratio. The pipeline's stages share this machine's cores, so the
// ratio measures the pipeline's overhead, not the speed-up a swarm of
// separate machines gives.
func init() {
	registerBench(benchGroup{Name: "swarm", Run: benchSwarm})
}

func benchSwarm(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	m, err := loadTestnetManifest("")
	if err != nil {
		return err
	}
	steps := 12
	if o.Quick {
		steps = 4
	}
	m.Train.Steps, m.Train.Optimizer.WarmupSteps = steps, 1
	m.Pipeline.Stages = 4
	m.Checkpoint.Interval = 0
	for _, codec := range []string{"fp32", "subspace"} {
		m.Pipeline.Codec = codec
		if codec == "fp32" {
			m.Pipeline.Rank = 0
		} else {
			m.Pipeline.Rank = 32
		}
		tok := tokenizer.Byte()
		spec, err := pipeline.SpecFor(m, tok)
		if err != nil {
			return err
		}
		newSource, err := pipeline.SourceFor(m, tok)
		if err != nil {
			return err
		}
		// The local trainer on the same model and data.
		tc := train.Config{Optim: spec.Optim, Schedule: spec.Schedule, ClipNorm: spec.ClipNorm}
		whole, err := model.New(spec.Model, model.WithSeed(spec.InitSeed))
		if err != nil {
			return err
		}
		tr, err := train.New([]*model.Stage{whole.Stage}, tc)
		if err != nil {
			return err
		}
		src, _ := newSource()
		tokens := int64(spec.Microbatches * spec.MicrobatchTokens())
		start := time.Now()
		for k := 0; k < steps; k++ {
			mbs := make([]model.Input, spec.Microbatches)
			for i := range mbs {
				in, tg, err := src.Next(spec.Rows, spec.SeqLen)
				if err != nil {
					return err
				}
				mbs[i] = model.Input{Batch: spec.Rows, Seq: spec.SeqLen, Tokens: in, Targets: tg}
			}
			if _, err := tr.Step(ctx, mbs); err != nil {
				return err
			}
		}
		localRate := float64(tokens*int64(steps)) / time.Since(start).Seconds()
		whole.Close()

		sw, err := pipelinetest.New(spec.Stages, pipelinetest.Options{})
		if err != nil {
			return err
		}
		var rate, boundary float64
		d, err := sw.Researcher().NewDriver(pipeline.DriverConfig{Spec: spec, NewSource: newSource, Logger: quietLogger(),
			Progress: func(p pipeline.Progress) { rate, boundary = p.TokensPerS, p.BoundaryBytesPerToken }}, sw.Client())
		if err != nil {
			sw.Close()
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err = d.Run(rctx)
		cancel()
		sw.Close()
		if err != nil {
			return fmt.Errorf("swarm run (%s): %w", codec, err)
		}
		r := row(fmt.Sprintf("swarm_train_tokens_per_s_4stage_%s", codec), rate, "tokens/s", localRate)
		r.Note = "demo model, 4 stage nodes + researcher on loopback in one process; baseline: the single-process trainer, same model and data, same run"
		emit(r)
		r = row(fmt.Sprintf("swarm_boundary_bytes_per_token_%s", codec), boundary, "bytes", float64(4*spec.Model.Dim))
		r.Note = "codec payload per token per stage boundary, forward + backward; baseline: bf16 activations"
		emit(r)
	}
	return nil
}
