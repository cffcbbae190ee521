// Package modeltest gives tests models with weights of order one instead
// of the small initialisation: every path of the network then carries a
// gradient worth checking, a tensor loaded under the wrong name or layout
// changes the logits, and the next token is rarely a near tie, so
// generations differ by prompt.
package modeltest

import (
	"hash/fnv"
	"math/rand/v2"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
)

// Weights says how Perturb draws each parameter's values. The generator
// is PCG seeded with a hash of the parameter's name on stream Stream, so
// the stages of a split model get the values of the whole one.
type Weights struct {
	Stream uint64
	Norm   float64 // 1-D parameters (norm weights): 1 + Norm·N(0,1)
	Matrix float64 // the others: Matrix·N(0,1)
	// PrintableHead zeroes the head rows of ids outside printable ASCII
	// (32–126), so a model over the byte vocabulary mostly writes readable
	// bytes: their logits are 0, most printable ones' far above.
	PrintableHead bool
}

// Perturb sets every parameter of stages as w says.
func Perturb(t testing.TB, w Weights, stages ...*model.Stage) {
	t.Helper()
	for _, s := range stages {
		for _, p := range s.Params() {
			h := fnv.New64a()
			h.Write([]byte(p.Name))
			r := rand.New(rand.NewPCG(h.Sum64(), w.Stream))
			data := make([]float32, p.Len())
			for i := range data {
				if len(p.Shape) == 1 {
					data[i] = float32(1 + w.Norm*r.NormFloat64())
				} else {
					data[i] = float32(w.Matrix * r.NormFloat64())
				}
			}
			if w.PrintableHead && p.Name == model.NameHead {
				d := p.Shape[1]
				for id := range p.Shape[0] {
					if id < 32 || id > 126 {
						clear(data[id*d : (id+1)*d])
					}
				}
			}
			if err := p.Set(data); err != nil {
				t.Fatal(err)
			}
		}
	}
}
