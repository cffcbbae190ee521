// Package train runs a model cut into stages inside one process: each
// microbatch goes forward through the stages in turn and straight back, the
// gradients of the step are tied, clipped to a global norm assembled from
// every stage's share, and each stage's AdamW applies the update.
//
// It is the single-process reference a distributed pipeline must agree
// with, the engine of a local training run, and what the training
// benchmark measures.
package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Config sets the optimisation of a run.
type Config struct {
	Optim    optim.Config
	Schedule optim.Schedule
	// ClipNorm bounds the global gradient norm; 0 disables clipping.
	ClipNorm float64
}

// Trainer owns the stages of one model and their optimizers. It is not
// safe for concurrent use.
type Trainer struct {
	stages []*model.Stage
	opts   []*optim.AdamW
	cfg    Config
	step   int
}

// New returns a trainer over stages, which must cover one model in order
// (model.NewStages) and start with zero gradients.
func New(stages []*model.Stage, cfg Config) (*Trainer, error) {
	if len(stages) == 0 {
		return nil, errors.New("train: no stages")
	}
	if !stages[0].Span().Embed || !stages[len(stages)-1].Span().Head {
		return nil, errors.New("train: the stages must run from the embedding to the head")
	}
	for i := 1; i < len(stages); i++ {
		if stages[i].Span().First != stages[i-1].Span().Last {
			return nil, fmt.Errorf("train: stage %d starts at block %d, stage %d ends at %d",
				i, stages[i].Span().First, i-1, stages[i-1].Span().Last)
		}
	}
	if err := cfg.Schedule.Validate(); err != nil {
		return nil, err
	}
	if cfg.ClipNorm < 0 {
		return nil, fmt.Errorf("train: ClipNorm %g is negative", cfg.ClipNorm)
	}
	t := &Trainer{stages: stages, cfg: cfg}
	for _, s := range stages {
		o, err := optim.New(s.Backend(), cfg.Optim)
		if err != nil {
			return nil, err
		}
		t.opts = append(t.opts, o)
	}
	return t, nil
}

// Stages returns the stages being trained.
func (t *Trainer) Stages() []*model.Stage { return t.stages }

// Optimizers returns each stage's optimizer (for checkpoints).
func (t *Trainer) Optimizers() []*optim.AdamW { return t.opts }

// Steps is the number of steps taken.
func (t *Trainer) Steps() int { return t.step }

// Result describes one step.
type Result struct {
	Loss     float64 // mean NLL over the step's targets, before the update
	Targets  int     // targets counted
	GradNorm float64 // global gradient norm before clipping
	LR       float64 // learning rate used
	// Residuals is, per stage boundary, the largest subspace residual the
	// step's microbatches showed (nil without the constraint).
	Residuals []float64
}

// Step trains on one global batch given as microbatches, each with Batch,
// Seq, Tokens and Targets set (Positions optional). The loss is the mean
// over all the step's targets, whatever the split into microbatches.
func (t *Trainer) Step(ctx context.Context, microbatches []model.Input) (Result, error) {
	var res Result
	total := 0
	for _, mb := range microbatches {
		for _, tg := range mb.Targets {
			if tg >= 0 {
				total++
			}
		}
	}
	if total == 0 {
		return res, errors.New("train: the batch has no targets")
	}
	last := len(t.stages) - 1
	if t.stages[0].Config().Subspace.Enabled() {
		res.Residuals = make([]float64, last)
	}
	for i, mb := range microbatches {
		if err := ctx.Err(); err != nil {
			t.abort()
			return res, err
		}
		hidden := []float32(nil)
		for si, s := range t.stages {
			in := model.Input{Batch: mb.Batch, Seq: mb.Seq, Tokens: mb.Tokens, Positions: mb.Positions, Hidden: hidden}
			if si == last {
				in.Targets, in.LossTokens = mb.Targets, total
			}
			out, err := s.Forward(i, in)
			if err != nil {
				t.abort()
				return res, fmt.Errorf("train: microbatch %d forward on stage %d: %w", i, si, err)
			}
			if si == last {
				res.Loss += out.Loss
			} else if res.Residuals != nil {
				res.Residuals[si] = math.Max(res.Residuals[si], out.SubspaceResidual)
			}
			hidden = out.Hidden
		}
		var grad []float32
		for si := last; si >= 0; si-- {
			g, err := t.stages[si].Backward(i, grad)
			if err != nil {
				t.abort()
				return res, fmt.Errorf("train: microbatch %d backward on stage %d: %w", i, si, err)
			}
			grad = g
		}
	}
	res.Targets = total
	if err := model.TieGrads(t.stages...); err != nil {
		return res, err
	}
	var sumSq float64
	for _, s := range t.stages {
		sumSq += optim.SumSquares(s.Backend(), s.Params())
	}
	res.GradNorm = math.Sqrt(sumSq)
	if math.IsNaN(res.GradNorm) || math.IsInf(res.GradNorm, 0) {
		t.zero()
		return res, fmt.Errorf("train: gradient norm %g; step skipped", res.GradNorm)
	}
	scale := optim.ClipScale(sumSq, t.cfg.ClipNorm)
	res.LR = t.cfg.Schedule.LR(t.step)
	for i, s := range t.stages {
		if err := t.opts[i].Step(s.Params(), res.LR, scale); err != nil {
			return res, err
		}
	}
	t.zero()
	t.step++
	return res, nil
}

// Eval returns the mean loss over microbatches without training.
func (t *Trainer) Eval(ctx context.Context, microbatches []model.Input) (float64, error) {
	var sum float64
	count := 0
	last := len(t.stages) - 1
	for i, mb := range microbatches {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		hidden := []float32(nil)
		for si, s := range t.stages {
			in := model.Input{Batch: mb.Batch, Seq: mb.Seq, Tokens: mb.Tokens, Positions: mb.Positions, Hidden: hidden, NoGrad: true}
			if si == last {
				in.Targets = mb.Targets
			}
			out, err := s.Forward(i, in)
			if err != nil {
				return 0, fmt.Errorf("train: eval microbatch %d on stage %d: %w", i, si, err)
			}
			sum += out.LossSum
			count += out.Targets
			hidden = out.Hidden
		}
	}
	if count == 0 {
		return 0, errors.New("train: no targets to evaluate")
	}
	return sum / float64(count), nil
}

func (t *Trainer) abort() {
	for _, s := range t.stages {
		for _, mb := range s.InFlight() {
			s.Drop(mb)
		}
	}
	t.zero()
}

func (t *Trainer) zero() {
	for _, s := range t.stages {
		s.ZeroGrad()
	}
}

// Throughput is a measured training speed.
type Throughput struct {
	TokensPerSec float64
	StepTime     time.Duration
	Steps        int
	Tokens       int // per step
	Params       int64
}

// Measure trains cfg, uncut, on random tokens (batch sequences of seq
// tokens per step, one microbatch) on be and reports the speed of steps
// after the first. It runs at least minSteps steps and for at least
// minTime.
func Measure(ctx context.Context, cfg model.Config, be tensor.Backend, batch, seq, minSteps int, minTime time.Duration) (Throughput, error) {
	m, err := model.New(cfg, model.WithBackend(be), model.WithSeed(1))
	if err != nil {
		return Throughput{}, err
	}
	defer m.Close()
	tr, err := New([]*model.Stage{m.Stage}, Config{
		Optim:    optim.DefaultConfig(),
		Schedule: optim.Schedule{Peak: 1e-3, Min: 1e-4, Warmup: 2, Total: 1 << 20},
		ClipNorm: 1,
	})
	if err != nil {
		return Throughput{}, err
	}
	r := rand.New(rand.NewPCG(1, 2))
	n := batch * seq
	mb := model.Input{Batch: batch, Seq: seq, Tokens: make([]int32, n), Targets: make([]int32, n)}
	next := func() {
		for i := range mb.Tokens {
			mb.Tokens[i] = int32(r.IntN(cfg.Vocab))
			mb.Targets[i] = int32(r.IntN(cfg.Vocab))
		}
	}
	next()
	if _, err := tr.Step(ctx, []model.Input{mb}); err != nil { // warm-up: allocations, RoPE tables
		return Throughput{}, err
	}
	start := time.Now()
	steps := 0
	for steps < minSteps || time.Since(start) < minTime {
		next()
		if _, err := tr.Step(ctx, []model.Input{mb}); err != nil {
			return Throughput{}, err
		}
		steps++
	}
	el := time.Since(start)
	return Throughput{
		TokensPerSec: float64(steps*n) / el.Seconds(),
		StepTime:     el / time.Duration(steps),
		Steps:        steps,
		Tokens:       n,
		Params:       cfg.ParamCount(),
	}, nil
}

// DemoConfig is the benchmark model: d=256, 8 blocks, 8 heads sharing 4
// key/value heads, SwiGLU width 688, vocab as given.
func DemoConfig(vocab int) model.Config {
	return model.Config{Vocab: vocab, Dim: 256, Layers: 8, Heads: 8, KVHeads: 4, FFNDim: 688, MaxSeq: 256}
}
