package serve

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Sampling picks each next token from the model's logits.
type Sampling struct {
	// Temperature 0 is greedy decoding: the most likely token, the lowest
	// id on a tie. Above 0, tokens are drawn from softmax(logits/T).
	Temperature float64
	// TopP in (0, 1] keeps the smallest set of most likely tokens whose
	// probability reaches TopP (1: all of them).
	TopP float64
	// Seed makes sampling repeatable: the same seed, prompt and model give
	// the same tokens (the same as `holopeer generate --seed`).
	Seed uint64
}

// pcgStream is the second word of the sampler's PCG state; it is fixed so
// that a seed alone decides the draws.
const pcgStream = 0x6e6572617465

// Sampler picks tokens for one sequence. It is not safe for concurrent
// use.
type Sampler struct {
	s     Sampling
	rng   *rand.Rand
	probs []float64
	order []int
}

// NewSampler returns a sampler for one sequence.
func NewSampler(s Sampling) *Sampler {
	if s.TopP <= 0 || s.TopP > 1 {
		s.TopP = 1
	}
	return &Sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, pcgStream))}
}

// Pick chooses the next token from logits (one per vocabulary id).
func (p *Sampler) Pick(logits []float32) int32 {
	if len(logits) == 0 {
		return 0
	}
	if p.s.Temperature <= 0 {
		best := 0
		for i, l := range logits {
			if l > logits[best] {
				best = i
			}
		}
		return int32(best)
	}
	top := float64(slices.Max(logits))
	p.probs = p.probs[:0]
	var total float64
	for _, l := range logits {
		w := math.Exp((float64(l) - top) / p.s.Temperature)
		p.probs = append(p.probs, w)
		total += w
	}
	p.order = p.order[:0]
	for i := range p.probs {
		p.order = append(p.order, i)
	}
	if p.s.TopP < 1 {
		// Most likely first, ties by id, then cut where the mass reaches
		// TopP of the whole.
		slices.SortStableFunc(p.order, func(a, b int) int {
			switch {
			case p.probs[a] > p.probs[b]:
				return -1
			case p.probs[a] < p.probs[b]:
				return 1
			}
			return 0
		})
		var mass float64
		for k, i := range p.order {
			mass += p.probs[i]
			if mass >= p.s.TopP*total {
				p.order = p.order[:k+1]
				break
			}
		}
		total = mass
	}
	u := p.rng.Float64() * total
	for _, i := range p.order {
		u -= p.probs[i]
		if u < 0 {
			return int32(i)
		}
	}
	return int32(p.order[len(p.order)-1])
}
