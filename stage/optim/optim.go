// Package optim updates a stage's parameters: AdamW with decoupled weight
// decay, global-norm gradient clipping whose norm can be assembled across
// stages, and a warmup + cosine learning-rate schedule. The update runs on
// the stage's backend.
package optim

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Config holds AdamW's hyper-parameters. The learning rate is given per
// step (see Schedule).
type Config struct {
	Beta1       float64 `json:"beta1" yaml:"beta1"`
	Beta2       float64 `json:"beta2" yaml:"beta2"`
	Eps         float64 `json:"eps" yaml:"eps"`
	WeightDecay float64 `json:"weight_decay" yaml:"weight_decay"` // decoupled; not applied to norm gains
}

// DefaultConfig is the usual setting for small language models.
func DefaultConfig() Config {
	return Config{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return fmt.Errorf("optim: Beta1 %g outside [0,1)", c.Beta1)
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return fmt.Errorf("optim: Beta2 %g outside [0,1)", c.Beta2)
	case !(c.Eps > 0):
		return fmt.Errorf("optim: Eps %g must be positive", c.Eps)
	case !(c.WeightDecay >= 0 && c.WeightDecay < 1):
		return fmt.Errorf("optim: WeightDecay %g outside [0,1)", c.WeightDecay)
	}
	return nil
}

// AdamW keeps the two moments of every parameter it has stepped, keyed by
// parameter name, on the backend. One AdamW serves one stage.
type AdamW struct {
	be    tensor.Backend
	cfg   Config
	steps int
	m, v  map[string]tensor.Buffer
}

// New returns an optimizer whose state lives on be.
func New(be tensor.Backend, cfg Config) (*AdamW, error) {
	if be == nil {
		return nil, errors.New("optim: nil backend")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &AdamW{be: be, cfg: cfg, m: map[string]tensor.Buffer{}, v: map[string]tensor.Buffer{}}, nil
}

// Steps is the number of updates applied (the step count of the bias
// correction).
func (a *AdamW) Steps() int { return a.steps }

// Step applies one update to params with learning rate lr, multiplying
// every gradient by gradScale first (the clipping factor from ClipScale,
// 1 for none). It does not clear the gradients.
func (a *AdamW) Step(params []*model.Param, lr, gradScale float64) error {
	if !(lr >= 0) || math.IsInf(lr, 0) {
		return fmt.Errorf("optim: learning rate %g", lr)
	}
	if !(gradScale >= 0) || math.IsInf(gradScale, 0) {
		return fmt.Errorf("optim: gradient scale %g", gradScale)
	}
	a.steps++
	for _, p := range params {
		m, ok := a.m[p.Name]
		if !ok {
			m = a.be.Alloc(tensor.Float32, p.Len())
			a.m[p.Name] = m
			a.v[p.Name] = a.be.Alloc(tensor.Float32, p.Len())
		}
		if m.Len() != p.Len() {
			return fmt.Errorf("optim: %s has %d elements, its state %d", p.Name, p.Len(), m.Len())
		}
		wd := a.cfg.WeightDecay
		if !p.Decay {
			wd = 0
		}
		a.be.AdamW(p.Value, p.Grad, m, a.v[p.Name], tensor.AdamWStep{
			LR: float32(lr), Beta1: float32(a.cfg.Beta1), Beta2: float32(a.cfg.Beta2),
			Eps: float32(a.cfg.Eps), WeightDecay: float32(wd),
			GradScale: float32(gradScale), Step: a.steps,
		})
	}
	return a.be.Sync()
}

// State names of the moment tensors in StateTensors.
const (
	stateM = "optim.adamw.m."
	stateV = "optim.adamw.v."
)

// StateTensors downloads the moments (for a checkpoint), named
// "optim.adamw.m.<param>" and "optim.adamw.v.<param>", in params' order.
func (a *AdamW) StateTensors(params []*model.Param) []model.HostTensor {
	var out []model.HostTensor
	for _, t := range a.LazyState(params) {
		data := make([]float32, numel(t.Shape))
		t.Read(data)
		out = append(out, model.HostTensor{Name: t.Name, Shape: t.Shape, Data: data})
	}
	return out
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// LazyState lists the moments StateTensors would download, each read
// only when asked.
func (a *AdamW) LazyState(params []*model.Param) []model.LazyTensor {
	var out []model.LazyTensor
	for _, p := range params {
		m, ok := a.m[p.Name]
		if !ok {
			continue
		}
		for _, x := range []struct {
			prefix string
			buf    tensor.Buffer
		}{{stateM, m}, {stateV, a.v[p.Name]}} {
			out = append(out, model.LazyTensor{Name: x.prefix + p.Name, Shape: append([]int(nil), p.Shape...), Read: func(dst []float32) { a.be.Download(dst, x.buf) }})
		}
	}
	return out
}

// Reset forgets every moment and the step count: a fresh optimizer.
func (a *AdamW) Reset() {
	for name, b := range a.m {
		a.be.Free(b)
		a.be.Free(a.v[name])
	}
	a.m, a.v, a.steps = map[string]tensor.Buffer{}, map[string]tensor.Buffer{}, 0
}

// IsState reports whether name is a moment tensor, and of which parameter.
func IsState(name string) (param string, ok bool) {
	for _, pre := range []string{stateM, stateV} {
		if strings.HasPrefix(name, pre) {
			return strings.TrimPrefix(name, pre), true
		}
	}
	return "", false
}

// LoadState restores the step count and moments saved by StateTensors;
// every tensor must name a parameter of params and match its size.
func (a *AdamW) LoadState(steps int, params []*model.Param, state []model.HostTensor) error {
	if steps < 0 {
		return fmt.Errorf("optim: negative step count %d", steps)
	}
	byName := map[string]*model.Param{}
	for _, p := range params {
		byName[p.Name] = p
	}
	for _, t := range state {
		var target map[string]tensor.Buffer
		var name string
		switch {
		case strings.HasPrefix(t.Name, stateM):
			target, name = a.m, strings.TrimPrefix(t.Name, stateM)
		case strings.HasPrefix(t.Name, stateV):
			target, name = a.v, strings.TrimPrefix(t.Name, stateV)
		default:
			return fmt.Errorf("optim: unknown state tensor %q", t.Name)
		}
		p, ok := byName[name]
		if !ok {
			return fmt.Errorf("optim: state %q for a parameter this stage does not hold", t.Name)
		}
		if len(t.Data) != p.Len() {
			return fmt.Errorf("optim: state %q has %d values, parameter %d", t.Name, len(t.Data), p.Len())
		}
		if _, ok := a.m[name]; !ok {
			a.m[name] = a.be.Alloc(tensor.Float32, p.Len())
			a.v[name] = a.be.Alloc(tensor.Float32, p.Len())
		}
		a.be.Upload(target[name], t.Data)
	}
	a.steps = steps
	return nil
}

// SumSquares is Σ grad² over params, the stage's share of the squared
// global gradient norm. Tied replicas are skipped so that a weight held by
// two stages counts once. A pipeline adds the stages' sums (after
// model.TieGrads, and after averaging among replicas) and passes the total
// to ClipScale.
func SumSquares(be tensor.Backend, params []*model.Param) float64 {
	var s float64
	for _, p := range params {
		if !p.Tied {
			s += be.SumSquares(p.Grad)
		}
	}
	return s
}

// ClipScale returns the factor that brings a gradient of squared norm
// sumSquares down to maxNorm (1 when it is already within, or when maxNorm
// is 0: no clipping), as torch.nn.utils.clip_grad_norm_ does.
func ClipScale(sumSquares, maxNorm float64) float64 {
	norm := math.Sqrt(sumSquares)
	if maxNorm <= 0 || norm <= maxNorm {
		return 1
	}
	return maxNorm / (norm + 1e-6)
}

// Schedule is linear warmup to Peak over Warmup steps, then cosine decay
// to Min at step Total, then Min.
type Schedule struct {
	Peak   float64 `json:"peak" yaml:"peak"`     // learning rate at the end of warmup
	Min    float64 `json:"min" yaml:"min"`       // floor reached at Total
	Warmup int     `json:"warmup" yaml:"warmup"` // steps of linear warmup
	Total  int     `json:"total" yaml:"total"`   // step at which the cosine reaches Min
}

// Validate reports the first bad field.
func (s Schedule) Validate() error {
	switch {
	case !(s.Peak > 0) || math.IsInf(s.Peak, 0):
		return fmt.Errorf("optim: peak learning rate %g must be positive", s.Peak)
	case !(s.Min >= 0 && s.Min <= s.Peak):
		return fmt.Errorf("optim: min learning rate %g outside [0, peak %g]", s.Min, s.Peak)
	case s.Warmup < 0 || s.Total < s.Warmup:
		return fmt.Errorf("optim: warmup %d and total %d steps: need 0 ≤ warmup ≤ total", s.Warmup, s.Total)
	}
	return nil
}

// LR is the learning rate of step (counting from 0).
func (s Schedule) LR(step int) float64 {
	if step < s.Warmup {
		return s.Peak * float64(step+1) / float64(s.Warmup)
	}
	if step >= s.Total || s.Total == s.Warmup {
		return s.Min
	}
	progress := float64(step-s.Warmup) / float64(s.Total-s.Warmup)
	return s.Min + (s.Peak-s.Min)*0.5*(1+math.Cos(math.Pi*progress))
}
