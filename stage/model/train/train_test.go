package train_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
)

var tinyCfg = model.Config{Vocab: 17, Dim: 16, Layers: 2, Heads: 2, KVHeads: 1, FFNDim: 24, MaxSeq: 16}

func trainCfg() train.Config {
	return train.Config{Optim: optim.DefaultConfig(), Schedule: optim.Schedule{Peak: 1e-2, Min: 1e-3, Warmup: 2, Total: 30}, ClipNorm: 1}
}

// repeating is a batch a small model can learn: every sequence counts up.
func repeating(vocab int) []model.Input {
	in := model.Input{Batch: 2, Seq: 8}
	for b := 0; b < 2; b++ {
		for i := 0; i < 8; i++ {
			in.Tokens = append(in.Tokens, int32((b*3+i)%vocab))
			in.Targets = append(in.Targets, int32((b*3+i+1)%vocab))
		}
	}
	return []model.Input{in}
}

func TestLossFalls(t *testing.T) {
	spans, _ := model.EvenSpans(2, 2)
	stages, err := model.NewStages(tinyCfg, spans, model.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := train.New(stages, trainCfg())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := repeating(tinyCfg.Vocab)
	before, err := tr.Eval(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		if _, err := tr.Step(ctx, data); err != nil {
			t.Fatal(err)
		}
	}
	after, err := tr.Eval(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if !(after < before/2) {
		t.Errorf("loss %.3f → %.3f after 30 steps on a memorisable batch", before, after)
	}
	if tr.Steps() != 30 {
		t.Errorf("Steps() = %d", tr.Steps())
	}
}

func TestStepErrorsLeaveNothingInFlight(t *testing.T) {
	spans, _ := model.EvenSpans(2, 2)
	stages, _ := model.NewStages(tinyCfg, spans)
	tr, err := train.New(stages, trainCfg())
	if err != nil {
		t.Fatal(err)
	}
	good := repeating(tinyCfg.Vocab)[0]
	bad := good
	bad.Tokens = append([]int32{99}, good.Tokens[1:]...)
	if _, err := tr.Step(context.Background(), []model.Input{good, bad}); err == nil {
		t.Fatal("a token outside the vocab was accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tr.Step(ctx, []model.Input{good}); err == nil {
		t.Fatal("a cancelled step ran")
	}
	noTargets := good
	noTargets.Targets = make([]int32, len(good.Targets))
	for i := range noTargets.Targets {
		noTargets.Targets[i] = -1
	}
	if _, err := tr.Step(context.Background(), []model.Input{noTargets}); err == nil {
		t.Fatal("a batch without targets was accepted")
	}
	for _, s := range stages {
		if n := len(s.InFlight()); n != 0 {
			t.Fatalf("%d microbatches left in flight", n)
		}
		for _, p := range s.Params() {
			for _, g := range p.GradData() {
				if g != 0 {
					t.Fatalf("%s kept gradients of a failed step", p.Name)
				}
			}
		}
	}
	if tr.Steps() != 0 {
		t.Fatalf("failed steps counted: %d", tr.Steps())
	}
}

func TestNewRejectsBadPipelines(t *testing.T) {
	spans, _ := model.EvenSpans(2, 2)
	stages, _ := model.NewStages(tinyCfg, spans)
	for name, s := range map[string][]*model.Stage{
		"none":     nil,
		"no head":  stages[:1],
		"no embed": stages[1:],
		"reversed": {stages[1], stages[0]},
	} {
		if _, err := train.New(s, trainCfg()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := trainCfg()
	c.Schedule.Peak = 0
	if _, err := train.New(stages, c); err == nil {
		t.Error("a zero peak learning rate was accepted")
	}
}

func TestMeasure(t *testing.T) {
	tp, err := train.Measure(context.Background(), tinyCfg, cpu.New(), 2, 8, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tp.TokensPerSec <= 0 || tp.Steps < 2 || tp.Tokens != 16 {
		t.Fatalf("%+v", tp)
	}
}

// BenchmarkTrainStep measures a training step (forward, backward, clip,
// AdamW) of the demo model, d=256, 8 blocks, batch 4 × 64 tokens.
func BenchmarkTrainStep(b *testing.B) {
	for _, vocab := range []int{512, 50257} {
		b.Run(fmt.Sprintf("vocab=%d", vocab), func(b *testing.B) {
			cfg := train.DemoConfig(vocab)
			m, err := model.New(cfg, model.WithSeed(1))
			if err != nil {
				b.Fatal(err)
			}
			tr, err := train.New([]*model.Stage{m.Stage}, train.Config{
				Optim: optim.DefaultConfig(), Schedule: optim.Schedule{Peak: 1e-3, Total: 1 << 30}, ClipNorm: 1,
			})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 1))
			const batch, seq = 4, 64
			in := model.Input{Batch: batch, Seq: seq, Tokens: make([]int32, batch*seq), Targets: make([]int32, batch*seq)}
			for i := range in.Tokens {
				in.Tokens[i], in.Targets[i] = int32(r.IntN(vocab)), int32(r.IntN(vocab))
			}
			ctx := context.Background()
			if _, err := tr.Step(ctx, []model.Input{in}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if _, err := tr.Step(ctx, []model.Input{in}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch*seq)/time.Since(start).Seconds(), "tokens/s")
		})
	}
}
