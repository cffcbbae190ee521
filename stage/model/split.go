package model

import (
	"fmt"
	"slices"
)

// Model is the uncut model: every block, the embedding and the head in one
// Stage. It is the single-process reference a pipeline is compared with.
type Model struct {
	*Stage
}

// New builds the whole model.
func New(cfg Config, opts ...Option) (*Model, error) {
	s, err := NewStage(cfg, Whole(cfg), opts...)
	if err != nil {
		return nil, err
	}
	return &Model{Stage: s}, nil
}

// EvenSpans cuts layers blocks into n contiguous spans whose sizes differ
// by at most one (earlier spans get the extra blocks); the first owns the
// embedding and the last the head.
func EvenSpans(layers, n int) ([]Span, error) {
	if n <= 0 || (n > layers && n > 1) {
		return nil, fmt.Errorf("%w: cannot cut %d blocks into %d stages", ErrConfig, layers, n)
	}
	return SpansAt(layers, cutsEvenly(layers, n))
}

// SpansAt cuts layers blocks at the given interior block boundaries
// (strictly increasing, each in 1..layers−1).
func SpansAt(layers int, cuts []int) ([]Span, error) {
	bounds := append(append([]int{0}, cuts...), layers)
	for i := 1; i < len(bounds); i++ {
		if bounds[i] <= bounds[i-1] {
			return nil, fmt.Errorf("%w: cuts %v do not increase strictly within 1..%d", ErrConfig, cuts, layers-1)
		}
	}
	spans := make([]Span, len(bounds)-1)
	for i := range spans {
		spans[i] = Span{First: bounds[i], Last: bounds[i+1], Embed: i == 0, Head: i == len(spans)-1}
	}
	return spans, nil
}

func cutsEvenly(layers, n int) []int {
	var cuts []int
	at := 0
	for i := 0; i < n-1; i++ {
		at += layers / n
		if i < layers%n {
			at++
		}
		cuts = append(cuts, at)
	}
	return cuts
}

// NewStages builds one stage per span; the spans must cover the model in
// order (as EvenSpans or SpansAt make them).
func NewStages(cfg Config, spans []Span, opts ...Option) ([]*Stage, error) {
	if len(spans) == 0 {
		return nil, fmt.Errorf("%w: no spans", ErrConfig)
	}
	for i, sp := range spans {
		wantFirst := 0
		if i > 0 {
			wantFirst = spans[i-1].Last
		}
		if sp.First != wantFirst || sp.Embed != (i == 0) || sp.Head != (i == len(spans)-1) {
			return nil, fmt.Errorf("%w: span %d %+v does not continue the cut", ErrConfig, i, sp)
		}
	}
	if spans[len(spans)-1].Last != cfg.Layers {
		return nil, fmt.Errorf("%w: spans end at block %d of %d", ErrConfig, spans[len(spans)-1].Last, cfg.Layers)
	}
	stages := make([]*Stage, len(spans))
	for i, sp := range spans {
		s, err := NewStage(cfg, sp, opts...)
		if err != nil {
			for _, prev := range stages[:i] {
				prev.Close()
			}
			return nil, fmt.Errorf("model: stage %d: %w", i, err)
		}
		stages[i] = s
	}
	return stages, nil
}

// TieGrads makes the gradients of a weight held by several stages (the
// tied embedding and LM head of a first and last stage) equal to their
// sum, on every holder, so that their identical optimizer steps keep the
// copies equal. Call it after the last backward of a step, before clipping.
func TieGrads(stages ...*Stage) error {
	holders := map[string][]*Param{}
	var names []string
	for _, s := range stages {
		for _, p := range s.params {
			if _, seen := holders[p.Name]; !seen {
				names = append(names, p.Name)
			}
			holders[p.Name] = append(holders[p.Name], p)
		}
	}
	for _, name := range names {
		ps := holders[name]
		if len(ps) < 2 {
			continue
		}
		if !slices.ContainsFunc(ps, func(p *Param) bool { return p.Tied }) {
			return fmt.Errorf("model: %s is held by %d stages but is not a tied weight", name, len(ps))
		}
		sum := ps[0].GradData()
		for _, p := range ps[1:] {
			for i, v := range p.GradData() {
				sum[i] += v
			}
		}
		for _, p := range ps {
			if err := p.SetGrad(sum); err != nil {
				return err
			}
		}
	}
	return nil
}
