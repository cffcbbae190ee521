package data

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// The synthetic corpus is an order-2 Markov source over 30 characters:
// the next character depends on the two before it. Each two-character
// context allows a few successors with peaked probabilities, so samples
// look like words ("tha ore sen. ..."), a small transformer only needs two
// characters of context, and the entropy rate follows exactly from the
// stationary distribution of the chain of contexts.

// alphabet is the corpus's characters; their ids are their bytes, so
// tokenizer.Byte() encodes and decodes the corpus.
const alphabet = "abcdefghijklmnopqrstuvwxyz .,\n"

const (
	numLetters = 26
	symSpace   = 26
	symPeriod  = 27
	symComma   = 28
	symNewline = 29
	numSyms    = 30
)

// SyntheticConfig sets the source. Zero Successors and Temperature take
// the defaults of DefaultSyntheticConfig; every Seed, 0 included, is used
// as given.
type SyntheticConfig struct {
	// Seed picks the transition structure and the sample stream.
	Seed uint64
	// Successors is how many next characters a context after a letter,
	// space or line break allows (the sparsity knob), 2 to 26.
	Successors int
	// Temperature spreads probability over a context's successors: the
	// successor ranked r has weight exp(-r/Temperature). Lower is more
	// peaked and lowers the entropy rate; (0, 100].
	Temperature float64
}

// DefaultSyntheticConfig is the demo corpus: an entropy rate of about
// 1.2 nats per character.
func DefaultSyntheticConfig() SyntheticConfig {
	return SyntheticConfig{Seed: 1, Successors: 5, Temperature: 1.5}
}

// Synthetic is a seeded order-2 Markov source of word-like text. It is a
// Source over tokenizer.Byte() ids and is safe for concurrent use.
type Synthetic struct {
	cfg SyntheticConfig
	// rows[s] for state s = prev*numSyms + cur: the allowed next symbols
	// with their probabilities. States outside the chain's closed class
	// have no row.
	rows [numSyms * numSyms]row
	// pi is the stationary distribution over states (pairs).
	pi          [numSyms * numSyms]float64
	entropyRate float64 // H(X2 | X0, X1) under pi, nats
	firstStep   float64 // H(X1 | X0) under pi, nats

	mu     sync.Mutex
	rng    *rand.Rand
	state  int
	sample [numSyms * numSyms][]float64 // cumulative probabilities per state
}

type row struct {
	next []int
	prob []float64
}

// maxStructureTries bounds the search for a seed whose chain is one
// communicating class; random structures almost always are.
const maxStructureTries = 64

// NewSynthetic builds the chain for cfg, checks that it has a single
// closed class (so the entropy rate does not depend on where sampling
// starts), and computes its stationary distribution and entropy rate.
func NewSynthetic(cfg SyntheticConfig) (*Synthetic, error) {
	def := DefaultSyntheticConfig()
	if cfg.Successors == 0 {
		cfg.Successors = def.Successors
	}
	if cfg.Temperature == 0 {
		cfg.Temperature = def.Temperature
	}
	if cfg.Successors < 2 || cfg.Successors > numLetters {
		return nil, fmt.Errorf("data: synthetic Successors %d outside [2, %d]", cfg.Successors, numLetters)
	}
	if !(cfg.Temperature > 0 && cfg.Temperature <= 100) {
		return nil, fmt.Errorf("data: synthetic Temperature %g outside (0, 100]", cfg.Temperature)
	}
	s := &Synthetic{cfg: cfg}
	for try := range maxStructureTries {
		s.build(rand.New(rand.NewPCG(cfg.Seed, 0x5eed0000+uint64(try))))
		if s.irreducible() {
			if err := s.stationary(); err != nil {
				return nil, err
			}
			s.computeEntropy()
			s.rng = rand.New(rand.NewPCG(cfg.Seed, 0x57a7e))
			s.state = s.drawState(s.rng)
			for st := range s.rows {
				s.sample[st] = cumulative(s.rows[st].prob)
			}
			return s, nil
		}
	}
	return nil, fmt.Errorf("data: synthetic seed %d gave no irreducible chain in %d tries", cfg.Seed, maxStructureTries)
}

// build draws the transition structure: for each context, which symbols
// may follow and in what rank order.
func (s *Synthetic) build(rng *rand.Rand) {
	weights := func(n int) []float64 {
		w := make([]float64, n)
		sum := 0.0
		for r := range w {
			w[r] = math.Exp(-float64(r) / s.cfg.Temperature)
			sum += w[r]
		}
		for r := range w {
			w[r] /= sum
		}
		return w
	}
	letters := func(n int) []int {
		return rng.Perm(numLetters)[:n]
	}
	k := s.cfg.Successors
	for prev := range numSyms {
		for cur := range numSyms {
			var next []int
			switch {
			case cur == symPeriod:
				// A sentence ends: a space, sometimes a line break.
				next = []int{symSpace, symNewline}
			case cur == symComma:
				next = []int{symSpace}
			case cur == symSpace || cur == symNewline:
				next = letters(k)
			default: // a letter: more letters or the end of the word
				next = append(letters(k-1), symSpace)
				if rng.IntN(4) == 0 {
					// Some word ends carry punctuation in place of the
					// least likely letter.
					next[0] = symPeriod
					if rng.IntN(2) == 0 {
						next[0] = symComma
					}
				}
				rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
			}
			s.rows[prev*numSyms+cur] = row{next: next, prob: weights(len(next))}
		}
	}
}

// startState is a context every sample passes through: ". " is reachable
// from anywhere, since every word can end and every end can be a period.
func startState() int { return symPeriod*numSyms + symSpace }

// irreducible reports whether the states reachable from startState all
// reach it back, so the chain restricted to them is one closed class, and
// clears the rows of states outside it.
func (s *Synthetic) irreducible() bool {
	forward := s.reach(startState(), false)
	backward := s.reach(startState(), true)
	for st := range s.rows {
		if forward[st] && !backward[st] {
			return false
		}
		if !forward[st] {
			s.rows[st] = row{}
		}
	}
	return true
}

// reach marks the states reachable from start, along transitions or
// against them.
func (s *Synthetic) reach(start int, reverse bool) []bool {
	var pred [numSyms * numSyms][]int
	if reverse {
		for st, r := range s.rows {
			for _, n := range r.next {
				to := (st%numSyms)*numSyms + n
				pred[to] = append(pred[to], st)
			}
		}
	}
	seen := make([]bool, numSyms*numSyms)
	stack := []int{start}
	seen[start] = true
	for len(stack) > 0 {
		st := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		var out []int
		if reverse {
			out = pred[st]
		} else {
			for _, n := range s.rows[st].next {
				out = append(out, (st%numSyms)*numSyms+n)
			}
		}
		for _, to := range out {
			if !seen[to] {
				seen[to] = true
				stack = append(stack, to)
			}
		}
	}
	return seen
}

// stationary solves pi = pi P by power iteration on the lazy chain
// (P+I)/2, which has the same stationary distribution and converges even
// for a periodic chain, to a residual at the level of rounding error.
func (s *Synthetic) stationary() error {
	n := numSyms * numSyms
	live := 0
	for st := range s.rows {
		if len(s.rows[st].next) > 0 {
			live++
		}
	}
	pi := make([]float64, n)
	for st := range s.rows {
		if len(s.rows[st].next) > 0 {
			pi[st] = 1 / float64(live)
		}
	}
	nextPi := make([]float64, n)
	const tol = 1e-15
	for iter := 0; iter < 1_000_000; iter++ {
		s.step(pi, nextPi)
		diff := 0.0
		for i := range pi {
			v := 0.5*pi[i] + 0.5*nextPi[i]
			diff += math.Abs(v - pi[i])
			pi[i] = v
		}
		if diff < tol {
			break
		}
	}
	// Check the answer against the definition, not the iteration.
	s.step(pi, nextPi)
	res, sum := 0.0, 0.0
	for i := range pi {
		res += math.Abs(nextPi[i] - pi[i])
		sum += pi[i]
	}
	if res > 1e-12 || math.Abs(sum-1) > 1e-12 {
		return fmt.Errorf("data: synthetic stationary distribution did not converge (residual %g, mass %g)", res, sum)
	}
	copy(s.pi[:], pi)
	return nil
}

// step computes out = in P.
func (s *Synthetic) step(in, out []float64) {
	clear(out)
	for st, r := range s.rows {
		if in[st] == 0 {
			continue
		}
		base := (st % numSyms) * numSyms
		for i, n := range r.next {
			out[base+n] += in[st] * r.prob[i]
		}
	}
}

func (s *Synthetic) computeEntropy() {
	// H(X2|X0,X1) = sum over contexts of pi(ctx) * H(row).
	var rate float64
	var first [numSyms]float64 // P(X0 = a)
	for st, r := range s.rows {
		h := 0.0
		for _, p := range r.prob {
			h -= p * math.Log(p)
		}
		rate += s.pi[st] * h
		first[st/numSyms] += s.pi[st]
	}
	// H(X1|X0) = H(X0,X1) - H(X0), with (X0,X1) ~ pi over pairs.
	joint, marg := 0.0, 0.0
	for _, p := range s.pi {
		if p > 0 {
			joint -= p * math.Log(p)
		}
	}
	for _, p := range first {
		if p > 0 {
			marg -= p * math.Log(p)
		}
	}
	s.entropyRate = rate
	s.firstStep = joint - marg
}

// EntropyRate is the source's true entropy rate in nats per token: the
// lowest cross-entropy any model can reach on it given at least two
// tokens of context. It is computed from the stationary distribution, not
// estimated from samples.
func (s *Synthetic) EntropyRate() float64 { return s.entropyRate }

// WindowBound is the lowest mean loss any model can reach on a window from
// Next(_, seqLen): its first target is predicted from one token of context
// (H(X1|X0)), the other seqLen-1 from two or more (the entropy rate).
func (s *Synthetic) WindowBound(seqLen int) float64 {
	if seqLen < 1 {
		return math.NaN()
	}
	return (s.firstStep + float64(seqLen-1)*s.entropyRate) / float64(seqLen)
}

// Config returns the configuration the source was built with, defaults
// filled in.
func (s *Synthetic) Config() SyntheticConfig { return s.cfg }

// VocabSize is tokenizer.Byte()'s: the corpus's ids are its bytes.
func (s *Synthetic) VocabSize() int { return tokenizer.Byte().VocabSize() }

// drawState samples a context from the stationary distribution, so a
// stream is stationary from its first token.
func (s *Synthetic) drawState(rng *rand.Rand) int {
	u := rng.Float64()
	last := 0
	for st, p := range s.pi {
		if p == 0 {
			continue
		}
		last = st
		if u < p {
			return st
		}
		u -= p
	}
	return last
}

func cumulative(p []float64) []float64 {
	c := make([]float64, len(p))
	sum := 0.0
	for i, v := range p {
		sum += v
		c[i] = sum
	}
	return c
}

// advance draws the symbol after state st and returns it with the new
// state.
func (s *Synthetic) advance(rng *rand.Rand, st int) (sym, next int) {
	c := s.sample[st]
	u := rng.Float64() * c[len(c)-1]
	i := 0
	for i < len(c)-1 && u >= c[i] {
		i++
	}
	sym = s.rows[st].next[i]
	return sym, (st%numSyms)*numSyms + sym
}

// Next returns batch windows of the stream, each a fresh stretch of
// seqLen+1 characters continuing where the last one ended.
func (s *Synthetic) Next(batch, seqLen int) (inputs, targets []int32, err error) {
	if err := checkShape(batch, seqLen); err != nil {
		return nil, nil, err
	}
	inputs = make([]int32, batch*seqLen)
	targets = make([]int32, batch*seqLen)
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range batch {
		in := inputs[r*seqLen : (r+1)*seqLen]
		tg := targets[r*seqLen : (r+1)*seqLen]
		var sym int
		sym, s.state = s.advance(s.rng, s.state)
		prev := int32(alphabet[sym])
		for t := range seqLen {
			sym, s.state = s.advance(s.rng, s.state)
			in[t] = prev
			tg[t] = int32(alphabet[sym])
			prev = tg[t]
		}
	}
	return inputs, targets, nil
}

// Text returns n characters of the source for demos and tests. It draws
// from its own seeded stream, so it neither disturbs nor depends on Next.
func (s *Synthetic) Text(n int) string {
	if n <= 0 {
		return ""
	}
	rng := rand.New(rand.NewPCG(s.cfg.Seed, 0x7e47))
	st := s.drawState(rng)
	out := make([]byte, n)
	for i := range out {
		var sym int
		sym, st = s.advance(rng, st)
		out[i] = alphabet[sym]
	}
	return string(out)
}

// symbolOf maps a byte id back to its symbol, or -1.
func symbolOf(id int32) int {
	for i := 0; i < numSyms; i++ {
		if int32(alphabet[i]) == id {
			return i
		}
	}
	return -1
}

// ErrImpossible: a token sequence the source cannot produce.
var ErrImpossible = errors.New("data: sequence impossible under the synthetic source")

// NLL is the mean negative log-likelihood, in nats per token, of
// tokens[2:] under the source given the two tokens before each. On a long
// sample it approaches EntropyRate.
func (s *Synthetic) NLL(tokens []int32) (float64, error) {
	if len(tokens) < 3 {
		return 0, errors.New("data: NLL needs at least three tokens")
	}
	total := 0.0
	for i := 2; i < len(tokens); i++ {
		p, err := s.prob(tokens[i-2], tokens[i-1], tokens[i])
		if err != nil {
			return 0, fmt.Errorf("at token %d: %w", i, err)
		}
		total -= math.Log(p)
	}
	return total / float64(len(tokens)-2), nil
}

// OptimalLoss is the mean loss of the Bayes-optimal model on one batch
// from Next(batch, seqLen): each row's first target is scored given one
// token, the rest given two. Comparing a model's loss on the same batch
// with this removes the sampling noise from the comparison.
func (s *Synthetic) OptimalLoss(inputs, targets []int32, batch, seqLen int) (float64, error) {
	if err := checkShape(batch, seqLen); err != nil {
		return 0, err
	}
	if len(inputs) != batch*seqLen || len(targets) != batch*seqLen {
		return 0, fmt.Errorf("data: %d inputs and %d targets, want %d each", len(inputs), len(targets), batch*seqLen)
	}
	total := 0.0
	for r := range batch {
		in := inputs[r*seqLen : (r+1)*seqLen]
		tg := targets[r*seqLen : (r+1)*seqLen]
		p, err := s.probGivenOne(in[0], tg[0])
		if err != nil {
			return 0, fmt.Errorf("row %d: %w", r, err)
		}
		total -= math.Log(p)
		for t := 1; t < seqLen; t++ {
			p, err := s.prob(in[t-1], in[t], tg[t])
			if err != nil {
				return 0, fmt.Errorf("row %d token %d: %w", r, t, err)
			}
			total -= math.Log(p)
		}
	}
	return total / float64(batch*seqLen), nil
}

// prob is P(c | a, b).
func (s *Synthetic) prob(a, b, c int32) (float64, error) {
	sa, sb, sc := symbolOf(a), symbolOf(b), symbolOf(c)
	if sa < 0 || sb < 0 || sc < 0 {
		return 0, fmt.Errorf("%w: id outside the alphabet", ErrImpossible)
	}
	r := s.rows[sa*numSyms+sb]
	for i, n := range r.next {
		if n == sc {
			return r.prob[i], nil
		}
	}
	return 0, fmt.Errorf("%w: %q after %q", ErrImpossible, alphabet[sc], alphabet[sa:sa+1]+alphabet[sb:sb+1])
}

// probGivenOne is P(X1 = b | X0 = a) under the stationary distribution.
func (s *Synthetic) probGivenOne(a, b int32) (float64, error) {
	sa, sb := symbolOf(a), symbolOf(b)
	if sa < 0 || sb < 0 {
		return 0, fmt.Errorf("%w: id outside the alphabet", ErrImpossible)
	}
	marg := 0.0
	for x := range numSyms {
		marg += s.pi[sa*numSyms+x]
	}
	joint := s.pi[sa*numSyms+sb]
	if joint == 0 {
		return 0, fmt.Errorf("%w: %q after %q", ErrImpossible, alphabet[sb], alphabet[sa])
	}
	return joint / marg, nil
}
