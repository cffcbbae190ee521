package subspace

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestOrthonormal(t *testing.T) {
	b, err := New(Config{Dim: 256, Rank: 16, Vocab: 300, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	d, k := b.Dim(), b.Rank()
	u := b.U()
	for p := 0; p < k; p++ {
		for q := 0; q < k; q++ {
			var s float64
			for i := 0; i < d; i++ {
				s += float64(u[i*k+p]) * float64(u[i*k+q])
			}
			want := 0.0
			if p == q {
				want = 1
			}
			if math.Abs(s-want) > 1e-6 {
				t.Fatalf("UᵀU[%d,%d] = %g, want %g", p, q, s, want)
			}
		}
	}
}

func TestRoundTripInsideSpan(t *testing.T) {
	b, err := New(Config{Dim: 4096, Rank: 40, Vocab: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	d, k := b.Dim(), b.Rank()
	r := rand.New(rand.NewPCG(1, 2))
	toks := []int{3, 999, 0, 512}
	n := len(toks)
	want := make([]float32, n*k)
	for i := range want {
		want[i] = float32(r.NormFloat64())
	}
	h := make([]float32, n*d)
	b.Decode(want, toks, h) // h = C·Uᵀ + E_fix: inside the constrained set
	got := make([]float32, n*k)
	resid := b.Encode(h, toks, got)
	if resid > 1e-5 {
		t.Fatalf("residual %g for a vector inside span(U)", resid)
	}
	// Rebuild h from the coefficients and compare with the original.
	h2 := make([]float32, n*d)
	b.Decode(got, toks, h2)
	var num, den float64
	for t0 := 0; t0 < n; t0++ {
		e := make([]float32, d)
		b.EFixRow(toks[t0], e)
		for i := 0; i < d; i++ {
			x := float64(h[t0*d+i] - e[i])
			y := float64(h2[t0*d+i] - e[i])
			num += (x - y) * (x - y)
			den += x * x
		}
	}
	if rel := math.Sqrt(num / den); rel > 1e-6 {
		t.Fatalf("relative reconstruction error %g > 1e-6", rel)
	}
}

func TestResidualDetectsEscape(t *testing.T) {
	b, _ := New(Config{Dim: 64, Rank: 4, Vocab: 10, Seed: 3})
	h := make([]float32, 64)
	b.EFixRow(5, h)
	h[0] += 1 // a component almost surely outside span(U)
	c := make([]float32, 4)
	if resid := b.Encode(h, []int{5}, c); resid < 0.5 {
		t.Fatalf("residual %g for a vector outside span(U)", resid)
	}
}

func TestDeterministicAndSeedSensitive(t *testing.T) {
	cfg := Config{Dim: 128, Rank: 8, Vocab: 50, Seed: 42}
	a, _ := New(cfg)
	b, _ := New(cfg)
	if a.Hash() != b.Hash() {
		t.Fatal("same config, different hash")
	}
	cfg.Seed++
	c, _ := New(cfg)
	if a.Hash() == c.Hash() {
		t.Fatal("different seed, same hash")
	}
}

func TestEFixMoments(t *testing.T) {
	b, _ := New(Config{Dim: 1024, Rank: 1, Vocab: 64, Seed: 9})
	row := make([]float32, 1024)
	var s, s2 float64
	for tok := 0; tok < 64; tok++ {
		b.EFixRow(tok, row)
		for _, x := range row {
			s += float64(x)
			s2 += float64(x) * float64(x)
		}
	}
	n := 64.0 * 1024
	mean, vr := s/n, s2/n-(s/n)*(s/n)
	if math.Abs(mean) > 0.02 || math.Abs(vr-1) > 0.03 {
		t.Fatalf("E_fix mean %g variance %g, want about 0 and 1", mean, vr)
	}
}

func TestGradProjection(t *testing.T) {
	b, _ := New(Config{Dim: 32, Rank: 5, Vocab: 4, Seed: 11})
	g := make([]float32, 2*32)
	for i := range g {
		g[i] = float32(i%7) - 3
	}
	gc := make([]float32, 2*5)
	b.ProjectGrad(g, 2, gc)
	lifted := make([]float32, 2*32)
	b.LiftGrad(gc, 2, lifted)
	// Projecting the lifted gradient again must give the same coefficients.
	gc2 := make([]float32, 2*5)
	b.ProjectGrad(lifted, 2, gc2)
	for i := range gc {
		if math.Abs(float64(gc[i]-gc2[i])) > 1e-4 {
			t.Fatalf("projection not idempotent at %d: %g vs %g", i, gc[i], gc2[i])
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{{Dim: 0, Rank: 1, Vocab: 1}, {Dim: 8, Rank: 9, Vocab: 1}, {Dim: MaxDim + 1, Rank: 1, Vocab: 1}, {Dim: 8, Rank: 1, Vocab: 0}} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}
