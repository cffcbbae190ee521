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
	// PresencePenalty is taken off the logit of every token this sequence
	// has already generated, FrequencyPenalty once more for each time it
	// did (OpenAI's definition: logit − c·frequency − [c>0]·presence, c
	// counting the tokens generated so far, not the prompt's).
	PresencePenalty, FrequencyPenalty float64
	// LogitBias is added to the logits of the ids it names before
	// anything else (OpenAI's logit_bias; −100 bans a token in practice).
	LogitBias map[int32]float64
	// Stream tells apart the draws of sequences that share a seed (the
	// choices of one request); 0 is what `holopeer generate` uses.
	Stream uint64
}

// pcgStream is the second word of the sampler's PCG state; it is fixed so
// that a seed alone decides the draws.
const pcgStream = 0x6e6572617465

// Sampler picks tokens for one sequence. It is not safe for concurrent
// use.
type Sampler struct {
	s      Sampling
	rng    *rand.Rand
	probs  []float64
	order  []int
	adj    []float32      // the adjusted logits, when biases or penalties apply
	last   []float32      // the logits the last Pick chose from
	counts map[int32]int  // tokens picked so far, for the penalties
	top    []TokenLogprob // scratch for Logprobs
	adjust bool           // whether the logits need adjusting at all
}

// NewSampler returns a sampler for one sequence.
func NewSampler(s Sampling) *Sampler {
	if s.TopP <= 0 || s.TopP > 1 {
		s.TopP = 1
	}
	return &Sampler{
		s: s, rng: rand.New(rand.NewPCG(s.Seed, pcgStream+s.Stream)), counts: map[int32]int{},
		adjust: len(s.LogitBias) > 0 || s.PresencePenalty != 0 || s.FrequencyPenalty != 0,
	}
}

// adjusted returns logits with the bias and penalties applied, in a
// buffer of the sampler's own (the engine's slice is not ours to change).
func (p *Sampler) adjusted(logits []float32) []float32 {
	if !p.adjust {
		return logits
	}
	p.adj = append(p.adj[:0], logits...)
	for id, b := range p.s.LogitBias {
		if int(id) < len(p.adj) && id >= 0 {
			p.adj[id] += float32(b)
		}
	}
	for id, c := range p.counts {
		if int(id) < len(p.adj) {
			p.adj[id] -= float32(float64(c)*p.s.FrequencyPenalty + p.s.PresencePenalty)
		}
	}
	return p.adj
}

// Pick chooses the next token from logits (one per vocabulary id).
func (p *Sampler) Pick(logits []float32) int32 {
	if len(logits) == 0 {
		p.last = nil
		return 0
	}
	logits = p.adjusted(logits)
	p.last = logits
	tok := p.pick(logits)
	p.counts[tok]++
	return tok
}

func (p *Sampler) pick(logits []float32) int32 {
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

// TokenLogprob is a token id and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float64
}

// Logprobs returns the log-probability of tok and the k most likely
// tokens (most likely first, ties by id) under the distribution the last
// Pick chose from: the model's logits after logit bias and penalties, at
// temperature 1 and before top-p, as OpenAI reports them. It must be
// called before the engine's next step; the slice is reused.
func (p *Sampler) Logprobs(tok int32, k int) (float64, []TokenLogprob) {
	l := p.last
	if len(l) == 0 || tok < 0 || int(tok) >= len(l) {
		return math.Inf(-1), nil
	}
	hi := float64(slices.Max(l))
	var sum float64
	for _, v := range l {
		sum += math.Exp(float64(v) - hi)
	}
	lse := hi + math.Log(sum)
	p.top = p.top[:0]
	k = min(k, len(l))
	for i, v := range l {
		lp := float64(v) - lse
		if len(p.top) == k && (k == 0 || lp <= p.top[k-1].Logprob) {
			continue
		}
		// Insert in order; equal values keep the lower id first.
		j := len(p.top)
		if j < k {
			p.top = append(p.top, TokenLogprob{})
		} else {
			j--
		}
		for j > 0 && p.top[j-1].Logprob < lp {
			p.top[j] = p.top[j-1]
			j--
		}
		p.top[j] = TokenLogprob{ID: int32(i), Logprob: lp}
	}
	return float64(l[tok]) - lse, p.top
}
