package tee_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/tee"
	"github.com/holopeer/holopeer/tee/internal/core"
)

// The verify targets run real signature checks (milliseconds each), so the
// fuzzer's default 60 s minimisation of each new input dominates short runs:
//
//	go test ./tee -run '^$' -fuzz '^FuzzVerifyReport$' -fuzztime 30s -fuzzminimizetime 50x

// FuzzVerifyEvidence feeds hostile wire bytes through the decoder and the
// real verifiers (fake roots, sim allowed, so every provider's code runs).
// Nothing may panic past the verifier, every rejection must carry exactly
// one sentinel, and anything accepted must say what the genuine evidence
// said.
func FuzzVerifyEvidence(f *testing.F) {
	w := newWorld(f)
	p := w.policy
	p.AllowSim = true
	v := w.verifier(f, p)
	genuine := map[string][]byte{}
	for _, ev := range []*tee.Evidence{w.snpEv, w.tdxEv, w.sEv} {
		b, err := ev.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		res, err := v.Verify(context.Background(), ev, w.expect)
		if err != nil {
			f.Fatal(err)
		}
		genuine[ev.Provider] = res.Measurement
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := tee.UnmarshalEvidence(b)
		if err != nil {
			return
		}
		res, err := v.Verify(context.Background(), ev, w.expect)
		if err != nil {
			n := 0
			for _, s := range core.Sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("error %v matches %d sentinels", err, n)
			}
			if strings.Contains(err.Error(), "panicked") {
				// Contained, but each one should get an explicit check.
				t.Fatalf("library panic: %v", err)
			}
			return
		}
		if !bytes.Equal(res.Measurement, genuine[ev.Provider]) {
			t.Fatalf("accepted %s evidence with measurement %x", ev.Provider, res.Measurement)
		}
	})
}

// FuzzVerifyReport mutates the hardware report and certificates of genuine
// evidence, keeping the claims valid, so the fuzzer spends its time inside
// the report parsers and verifiers rather than in the envelope decoder.
func FuzzVerifyReport(f *testing.F) {
	w := newWorld(f)
	p := w.policy
	p.AllowSim = true
	v := w.verifier(f, p)
	providers := []string{tee.ProviderSNP, tee.ProviderTDX, tee.ProviderSim}
	for i, ev := range []*tee.Evidence{w.snpEv, w.tdxEv, w.sEv} {
		var c0, c1 []byte
		if len(ev.Certs) > 0 {
			c0 = ev.Certs[0]
		}
		if len(ev.Certs) > 1 {
			c1 = ev.Certs[1]
		}
		f.Add(uint8(i), ev.Report, c0, c1)
	}
	f.Fuzz(func(t *testing.T, which uint8, report, c0, c1 []byte) {
		ev := &tee.Evidence{Provider: providers[int(which)%len(providers)], Report: report, Claims: w.expect}
		for _, c := range [][]byte{c0, c1} {
			if len(c) > 0 {
				ev.Certs = append(ev.Certs, c)
			}
		}
		res, err := v.Verify(context.Background(), ev, w.expect)
		if err != nil {
			n := 0
			for _, s := range core.Sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("error %v matches %d sentinels", err, n)
			}
			if strings.Contains(err.Error(), "panicked") {
				t.Fatalf("library panic: %v", err)
			}
			return
		}
		if res.Provider != ev.Provider {
			t.Fatalf("accepted %s evidence as %s", ev.Provider, res.Provider)
		}
	})
}
