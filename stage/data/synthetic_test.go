package data

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

func TestSyntheticDefaultRate(t *testing.T) {
	s, err := NewSynthetic(DefaultSyntheticConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := s.EntropyRate()
	t.Logf("default entropy rate %.4f nats/token, window bound (64) %.4f, (128) %.4f", h, s.WindowBound(64), s.WindowBound(128))
	if h < 1.0 || h > 1.5 {
		t.Errorf("default entropy rate %.4f outside the 1.0-1.5 nats the demo is sized for", h)
	}
	if b := s.WindowBound(64); b <= h || b > h*1.05 {
		t.Errorf("window bound %.4f not just above the rate %.4f", b, h)
	}
}

// TestSyntheticEmpiricalNLL: the mean negative log-likelihood of a long
// sample under the true model converges to the computed entropy rate.
func TestSyntheticEmpiricalNLL(t *testing.T) {
	cases := []struct {
		cfg SyntheticConfig
		n   int
		tol float64
	}{
		{DefaultSyntheticConfig(), 1 << 20, 0.01},
		{SyntheticConfig{Seed: 7, Successors: 3, Temperature: 0.7}, 1 << 18, 0.02},
		{SyntheticConfig{Seed: 9, Successors: 10, Temperature: 4}, 1 << 18, 0.02},
	}
	for _, c := range cases {
		s, err := NewSynthetic(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		// One long row is one contiguous stretch of the stream.
		in, tg, err := s.Next(1, c.n)
		if err != nil {
			t.Fatal(err)
		}
		nll, err := s.NLL(append(in[:1], tg...))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v: rate %.4f, empirical NLL over %d tokens %.4f", c.cfg, s.EntropyRate(), c.n, nll)
		if d := math.Abs(nll - s.EntropyRate()); d > c.tol {
			t.Errorf("%+v: empirical NLL %.4f, entropy rate %.4f (|diff| %.4f > %.3f)", c.cfg, nll, s.EntropyRate(), d, c.tol)
		}
	}
}

// TestSyntheticOptimalLoss: over many short windows the Bayes-optimal loss
// approaches WindowBound, which counts the one-token context of each
// window's first target.
func TestSyntheticOptimalLoss(t *testing.T) {
	s, err := NewSynthetic(DefaultSyntheticConfig())
	if err != nil {
		t.Fatal(err)
	}
	const batch, seqLen = 8192, 16
	in, tg, err := s.Next(batch, seqLen)
	if err != nil {
		t.Fatal(err)
	}
	loss, err := s.OptimalLoss(in, tg, batch, seqLen)
	if err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(loss - s.WindowBound(seqLen)); d > 0.01 {
		t.Errorf("optimal loss %.4f vs window bound %.4f", loss, s.WindowBound(seqLen))
	}
	// A sequence the source cannot produce is refused.
	if _, err := s.NLL([]int32{'a', 'a', '!'}); err == nil {
		t.Error("impossible sequence scored")
	}
}

// TestSyntheticStationaryExact cross-checks the power iteration with a
// direct solve of pi (P - I) = 0, sum(pi) = 1, by Gaussian elimination.
func TestSyntheticStationaryExact(t *testing.T) {
	s, err := NewSynthetic(DefaultSyntheticConfig())
	if err != nil {
		t.Fatal(err)
	}
	var states []int
	index := map[int]int{}
	for st, r := range s.rows {
		if len(r.next) > 0 {
			index[st] = len(states)
			states = append(states, st)
		}
	}
	n := len(states)
	// Rows of A are equations: A[j][i] = P[i][j] - delta(i,j), with the
	// last equation replaced by sum(pi) = 1.
	a := make([][]float64, n)
	for j := range a {
		a[j] = make([]float64, n+1)
	}
	for i, st := range states {
		r := s.rows[st]
		for k, nx := range r.next {
			to := (st%numSyms)*numSyms + nx
			a[index[to]][i] += r.prob[k]
		}
		a[i][i] -= 1
	}
	for i := range n {
		a[n-1][i] = 1
	}
	a[n-1][n] = 1
	for col := range n {
		p := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		a[col], a[p] = a[p], a[col]
		for r := range n {
			if r == col || a[r][col] == 0 {
				continue
			}
			f := a[r][col] / a[col][col]
			for c := col; c <= n; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	maxDiff := 0.0
	for i, st := range states {
		maxDiff = max(maxDiff, math.Abs(a[i][n]/a[i][i]-s.pi[st]))
	}
	if maxDiff > 1e-12 {
		t.Errorf("power iteration differs from the direct solve by %g", maxDiff)
	}
}

func TestSyntheticDeterministic(t *testing.T) {
	a, _ := NewSynthetic(SyntheticConfig{Seed: 3})
	b, _ := NewSynthetic(SyntheticConfig{Seed: 3})
	c, _ := NewSynthetic(SyntheticConfig{Seed: 4})
	for range 3 {
		ia, ta, _ := a.Next(4, 32)
		ib, tb, _ := b.Next(4, 32)
		ic, _, _ := c.Next(4, 32)
		if !slices.Equal(ia, ib) || !slices.Equal(ta, tb) {
			t.Fatal("same seed, different stream")
		}
		if slices.Equal(ia, ic) {
			t.Fatal("different seeds, same stream")
		}
		for r := range 4 {
			row := ia[r*32 : (r+1)*32]
			trow := ta[r*32 : (r+1)*32]
			if !slices.Equal(row[1:], trow[:31]) {
				t.Fatal("targets are not the inputs shifted by one")
			}
		}
	}
	if a.EntropyRate() != b.EntropyRate() || a.EntropyRate() == c.EntropyRate() {
		t.Error("entropy rate does not follow the seed")
	}
	// Text has its own stream: the same for a seed, whatever Next did.
	if a.Text(200) != b.Text(200) {
		t.Error("Text differs for the same seed")
	}
	b.Next(10, 10)
	if a.Text(200) != b.Text(200) {
		t.Error("Text depends on Next")
	}
}

func TestSyntheticTextIsByteTokens(t *testing.T) {
	s, _ := NewSynthetic(DefaultSyntheticConfig())
	text := s.Text(5000)
	if strings.Trim(text, alphabet) != "" {
		t.Error("text outside the alphabet")
	}
	if !strings.Contains(text, " ") || !strings.Contains(text, ".") {
		t.Error("text has no word or sentence breaks")
	}
	in, tg, _ := s.Next(2, 100)
	tok := tokenizer.Byte()
	for _, id := range append(in, tg...) {
		if id < 0 || int(id) >= s.VocabSize() || int(id) >= tok.VocabSize() {
			t.Fatalf("id %d outside the byte vocabulary", id)
		}
	}
	ids := make([]int, len(in))
	for i, id := range in {
		ids[i] = int(id)
	}
	if got := tok.Decode(ids); strings.Trim(got, alphabet) != "" {
		t.Errorf("decoded %q", got)
	}
	t.Logf("sample: %q", text[:160])
}

func TestSyntheticKnobs(t *testing.T) {
	// The rate rises with temperature and with successors.
	rate := func(k int, temp float64) float64 {
		s, err := NewSynthetic(SyntheticConfig{Seed: 1, Successors: k, Temperature: temp})
		if err != nil {
			t.Fatal(err)
		}
		return s.EntropyRate()
	}
	if !(rate(5, 0.5) < rate(5, 1.5) && rate(5, 1.5) < rate(5, 5)) {
		t.Error("entropy rate does not rise with temperature")
	}
	if !(rate(3, 2) < rate(8, 2)) {
		t.Error("entropy rate does not rise with successors")
	}
	for _, bad := range []SyntheticConfig{{Successors: 1}, {Successors: 27}, {Temperature: -1}, {Temperature: math.NaN()}, {Temperature: 1000}} {
		if _, err := NewSynthetic(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	s, _ := NewSynthetic(SyntheticConfig{})
	if want := (SyntheticConfig{Seed: 0, Successors: 5, Temperature: 1.5}); s.Config() != want {
		t.Errorf("zero config became %+v", s.Config())
	}
	if _, _, err := s.Next(0, 5); err == nil {
		t.Error("batch 0 accepted")
	}
	if _, _, err := s.Next(1<<20, 1<<20); err == nil {
		t.Error("huge batch accepted")
	}
}

func BenchmarkSyntheticNext(b *testing.B) {
	s, _ := NewSynthetic(DefaultSyntheticConfig())
	b.SetBytes(32 * 128)
	for b.Loop() {
		s.Next(32, 128)
	}
}
