package tee_test

import (
	"context"
	"testing"

	"github.com/holopeer/holopeer/tee"
)

// BenchmarkVerify measures one full verification per provider (fake roots,
// so the same cryptography as production). Noisy on the shared 2-core box.
func BenchmarkVerify(b *testing.B) {
	w := newWorld(b)
	p := w.policy
	p.AllowSim = true
	v := w.verifier(b, p)
	for _, ev := range []*tee.Evidence{w.snpEv, w.tdxEv, w.sEv} {
		b.Run(ev.Provider, func(b *testing.B) {
			for b.Loop() {
				if _, err := v.Verify(context.Background(), ev, w.expect); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAttest measures producing evidence against the fake hardware:
// the attester's own cost (binding, parsing, packing) plus the fakes'
// signing; real firmware adds its own latency.
func BenchmarkAttest(b *testing.B) {
	w := newWorld(b)
	for _, a := range []tee.Attester{w.amd, w.intel, w.simAtt} {
		b.Run(a.Provider(), func(b *testing.B) {
			for b.Loop() {
				if _, err := a.Attest(context.Background(), w.expect); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkUnmarshalEvidence(b *testing.B) {
	w := newWorld(b)
	wire, err := w.tdxEv.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		if _, err := tee.UnmarshalEvidence(wire); err != nil {
			b.Fatal(err)
		}
	}
}
