package tee_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/holopeer/holopeer/tee"
	"github.com/holopeer/holopeer/tee/internal/core"
	"github.com/holopeer/holopeer/tee/sim"
	"github.com/holopeer/holopeer/tee/snp"
	"github.com/holopeer/holopeer/tee/tdx"
	"github.com/holopeer/holopeer/tee/teetest"
)

const swarm = "holopeer-testnet"

// identityKey returns a real marshalled libp2p Ed25519 public key.
func identityKey(t testing.TB) []byte {
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b, err := crypto.MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func nonce(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// world holds fake hardware, the evidence it produced for the claims a
// verifier expects, and a policy that accepts exactly that evidence.
type world struct {
	expect            tee.Claims
	amd, intel        tee.Attester
	amdDebug          tee.Attester
	intelDebug        tee.Attester
	intelOtherRTMR    tee.Attester
	simAtt            tee.Attester
	snpRoots          snp.Roots
	intelFake         *teetest.Intel
	amdFake           *teetest.AMD
	policy            tee.Policy
	snpEv, tdxEv, sEv *tee.Evidence
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{expect: tee.Claims{Swarm: swarm, IdentityKey: identityKey(t), Nonce: nonce(1), Term: 5}}
	var err error
	chipTCB := kds.TCBParts{BlSpl: 3, TeeSpl: 0, SnpSpl: 8, UcodeSpl: 115}
	if w.amdFake, err = teetest.NewAMD(teetest.AMDOptions{TCB: chipTCB}); err != nil {
		t.Fatal(err)
	}
	w.amd = must(w.amdFake.Attester())
	w.amdDebug = must(w.amdFake.Variant(func(o *teetest.AMDOptions) { o.Debug = true }).Attester())
	w.snpRoots = w.amdFake.Roots()

	if w.intelFake, err = teetest.NewIntel(teetest.IntelOptions{QESVN: 8, PCESVN: 13}); err != nil {
		t.Fatal(err)
	}
	w.intel = must(w.intelFake.Attester())
	// The debug and other-image TDs run on the same fake platform (same roots).
	w.intelDebug = must(w.intelFake.Variant(func(o *teetest.IntelOptions) { o.Debug = true }).Attester())
	w.intelOtherRTMR = must(w.intelFake.Variant(func(o *teetest.IntelOptions) { o.RTMRs[2] = bytes.Repeat([]byte{0xEE}, 48) }).Attester())

	w.simAtt = must(sim.NewAttester(sim.TestnetKey(swarm), sim.WithMeasurement(bytes.Repeat([]byte{0x51}, sim.MeasurementSize))))

	w.policy = tee.Policy{
		SNP: snp.Policy{Measurements: [][]byte{teetest.SNPMeasurement}, MinTCB: kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 100}},
		TDX: tdx.Policy{
			Measurements: []tdx.Measurement{{MRTD: teetest.TDXMRTD, RTMRs: teetest.TDXRTMRs}},
			MinTeeTCBSVN: bytes.Repeat([]byte{3}, 16), MinQESVN: 8, MinPCESVN: 13,
		},
	}
	w.snpEv = w.attest(t, w.amd, w.expect)
	w.tdxEv = w.attest(t, w.intel, w.expect)
	w.sEv = w.attest(t, w.simAtt, w.expect)
	return w
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func (w *world) attest(t testing.TB, a tee.Attester, c tee.Claims) *tee.Evidence {
	t.Helper()
	ev, err := a.Attest(context.Background(), c)
	if err != nil {
		t.Fatalf("%s attest: %v", a.Provider(), err)
	}
	return ev
}

// verifier is a test verifier: the production code with the fake roots.
func (w *world) verifier(t testing.TB, p tee.Policy, opts ...tee.Option) *tee.Verifier {
	t.Helper()
	opts = append([]tee.Option{tee.WithSNPRoots(w.snpRoots), tee.WithTDXRoots(w.intelFake.Roots()), tee.WithLogger(quiet)}, opts...)
	v, err := tee.NewVerifier(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func clone(ev *tee.Evidence) *tee.Evidence {
	c := *ev
	c.Report = bytes.Clone(ev.Report)
	c.Certs = nil
	for _, x := range ev.Certs {
		c.Certs = append(c.Certs, bytes.Clone(x))
	}
	c.IdentityKey = bytes.Clone(ev.IdentityKey)
	c.Nonce = bytes.Clone(ev.Nonce)
	return &c
}

func TestGoodEvidenceAccepted(t *testing.T) {
	w := newWorld(t)
	simPolicy := w.policy
	simPolicy.AllowSim = true
	v := w.verifier(t, simPolicy)
	for _, ev := range []*tee.Evidence{w.snpEv, w.tdxEv, w.sEv} {
		// Through the wire encoding, as a peer receives it.
		wire, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := tee.UnmarshalEvidence(wire)
		if err != nil {
			t.Fatal(err)
		}
		res, err := v.Verify(context.Background(), got, w.expect)
		if err != nil {
			t.Fatalf("%s: good evidence rejected: %v", ev.Provider, err)
		}
		if res.Provider != ev.Provider || res.Insecure != (ev.Provider == tee.ProviderSim) {
			t.Fatalf("%s: result %+v", ev.Provider, res)
		}
		t.Logf("%-3s %5d bytes on the wire: %s", ev.Provider, len(wire), res)
	}
}

// TestRejections is the negative matrix: each case must be rejected with its
// own sentinel and no other.
func TestRejections(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	otherKey := identityKey(t)
	v := w.verifier(t, w.policy)
	simPolicy := w.policy
	simPolicy.AllowSim = true
	vSim := w.verifier(t, simPolicy)

	with := func(c tee.Claims, f func(*tee.Claims)) tee.Claims {
		c.IdentityKey = bytes.Clone(c.IdentityKey)
		f(&c)
		return c
	}
	flip := func(ev *tee.Evidence, off int) *tee.Evidence {
		c := clone(ev)
		c.Report[off] ^= 0x01
		return c
	}
	rewrite := func(ev *tee.Evidence, f func(*tee.Claims)) *tee.Evidence {
		c := clone(ev)
		f(&c.Claims)
		return c
	}
	oldNonce := w.expect
	oldNonce.Nonce = nonce(0xEE)
	oldTerm := w.expect
	oldTerm.Term = 4
	newExpect := func(f func(*tee.Claims)) tee.Claims { return with(w.expect, f) }

	prodV, err := tee.NewVerifier(w.policy, tee.WithLogger(quiet)) // AMD's and Intel's real roots
	if err != nil {
		t.Fatal(err)
	}
	later := func(d time.Duration) *tee.Verifier {
		return w.verifier(t, w.policy, tee.WithClock(func() time.Time { return time.Now().Add(d) }))
	}
	pol := func(f func(*tee.Policy)) *tee.Verifier { p := w.policy; f(&p); return w.verifier(t, p) }
	const snpMeasurementOff, tdxMRTDOff = 0x90, 0x30 + 0x88

	cases := []struct {
		name   string
		v      *tee.Verifier
		ev     *tee.Evidence
		expect tee.Claims
		want   error
	}{
		// SEV-SNP
		{"snp/different identity key", v, w.snpEv, newExpect(func(c *tee.Claims) { c.IdentityKey = otherKey }), tee.ErrIdentityMismatch},
		{"snp/claims rewritten to another key", v, rewrite(w.snpEv, func(c *tee.Claims) { c.IdentityKey = otherKey }), newExpect(func(c *tee.Claims) { c.IdentityKey = otherKey }), tee.ErrBindingMismatch},
		{"snp/flipped byte", v, flip(w.snpEv, snpMeasurementOff), w.expect, tee.ErrSignature},
		{"snp/stale nonce", v, w.attest(t, w.amd, oldNonce), w.expect, tee.ErrStaleNonce},
		{"snp/earlier term", v, w.attest(t, w.amd, oldTerm), w.expect, tee.ErrTermMismatch},
		{"snp/other swarm", v, w.snpEv, newExpect(func(c *tee.Claims) { c.Swarm = "another-swarm" }), tee.ErrSwarmMismatch},
		{"snp/debug bit", v, w.attest(t, w.amdDebug, w.expect), w.expect, tee.ErrDebug},
		{"snp/measurement off allowlist", pol(func(p *tee.Policy) { p.SNP.Measurements = [][]byte{bytes.Repeat([]byte{7}, 48)} }), w.snpEv, w.expect, tee.ErrMeasurement},
		{"snp/empty allowlist", pol(func(p *tee.Policy) { p.SNP.Measurements = nil }), w.snpEv, w.expect, tee.ErrMeasurement},
		{"snp/TCB below minimum", pol(func(p *tee.Policy) { p.SNP.MinTCB.SnpSpl = 9 }), w.snpEv, w.expect, tee.ErrTCB},
		{"snp/revoked chip", pol(func(p *tee.Policy) { p.SNP.RevokedChipIDs = [][]byte{teetest.SNPChipID} }), w.snpEv, w.expect, tee.ErrRevoked},
		{"snp/fake root vs production roots", prodV, w.snpEv, w.expect, tee.ErrUntrustedRoot},
		{"snp/expired chain", later(100 * 365 * 24 * time.Hour), w.snpEv, w.expect, tee.ErrUntrustedRoot},
		{"snp/VCEK stripped", v, func() *tee.Evidence { c := clone(w.snpEv); c.Certs = c.Certs[1:]; return c }(), w.expect, tee.ErrUntrustedRoot},
		{"snp/truncated report", v, func() *tee.Evidence { c := clone(w.snpEv); c.Report = c.Report[:100]; return c }(), w.expect, tee.ErrMalformed},
		{"snp/report labelled tdx", v, func() *tee.Evidence { c := clone(w.snpEv); c.Provider = tee.ProviderTDX; c.Certs = nil; return c }(), w.expect, tee.ErrMalformed},
		// TDX
		{"tdx/different identity key", v, w.tdxEv, newExpect(func(c *tee.Claims) { c.IdentityKey = otherKey }), tee.ErrIdentityMismatch},
		{"tdx/claims rewritten to another key", v, rewrite(w.tdxEv, func(c *tee.Claims) { c.IdentityKey = otherKey }), newExpect(func(c *tee.Claims) { c.IdentityKey = otherKey }), tee.ErrBindingMismatch},
		{"tdx/flipped byte", v, flip(w.tdxEv, tdxMRTDOff), w.expect, tee.ErrSignature},
		{"tdx/stale nonce", v, w.attest(t, w.intel, oldNonce), w.expect, tee.ErrStaleNonce},
		{"tdx/earlier term", v, w.attest(t, w.intel, oldTerm), w.expect, tee.ErrTermMismatch},
		{"tdx/debug bit", v, w.attest(t, w.intelDebug, w.expect), w.expect, tee.ErrDebug},
		{"tdx/MRTD off allowlist", pol(func(p *tee.Policy) {
			p.TDX.Measurements = []tdx.Measurement{{MRTD: bytes.Repeat([]byte{7}, 48), RTMRs: teetest.TDXRTMRs}}
		}), w.tdxEv, w.expect, tee.ErrMeasurement},
		{"tdx/RTMR off allowlist", v, w.attest(t, w.intelOtherRTMR, w.expect), w.expect, tee.ErrMeasurement},
		{"tdx/TEE TCB SVN below minimum", pol(func(p *tee.Policy) { p.TDX.MinTeeTCBSVN = bytes.Repeat([]byte{4}, 16) }), w.tdxEv, w.expect, tee.ErrTCB},
		{"tdx/QE SVN below minimum", pol(func(p *tee.Policy) { p.TDX.MinQESVN = 9 }), w.tdxEv, w.expect, tee.ErrTCB},
		{"tdx/revoked platform", pol(func(p *tee.Policy) { p.TDX.RevokedChipIDs = [][]byte{teetest.TDXPPID} }), w.tdxEv, w.expect, tee.ErrRevoked},
		{"tdx/fake root vs production root", prodV, w.tdxEv, w.expect, tee.ErrUntrustedRoot},
		{"tdx/expired chain", later(48 * time.Hour), w.tdxEv, w.expect, tee.ErrUntrustedRoot},
		{"tdx/truncated quote", v, func() *tee.Evidence { c := clone(w.tdxEv); c.Report = c.Report[:700]; return c }(), w.expect, tee.ErrMalformed},
		// sim
		{"sim/not allowed", v, w.sEv, w.expect, tee.ErrSimNotAllowed},
		{"sim/not allowed by production verifier", prodV, w.sEv, w.expect, tee.ErrSimNotAllowed},
		{"sim/untrusted testnet key", w.verifier(t, tee.Policy{AllowSim: true, Sim: sim.Policy{Keys: []ed25519.PublicKey{sim.TestnetKey("other").Public().(ed25519.PublicKey)}}}), w.sEv, w.expect, tee.ErrUntrustedRoot},
		{"sim/flipped byte", vSim, flip(w.sEv, 30), w.expect, tee.ErrSignature},
		{"sim/stale nonce", vSim, w.attest(t, w.simAtt, oldNonce), w.expect, tee.ErrStaleNonce},
		{"sim/claims rewritten to another key", vSim, rewrite(w.sEv, func(c *tee.Claims) { c.IdentityKey = otherKey }), newExpect(func(c *tee.Claims) { c.IdentityKey = otherKey }), tee.ErrBindingMismatch},
		{"sim/measurement off allowlist", w.verifier(t, tee.Policy{AllowSim: true, Sim: sim.Policy{Measurements: [][]byte{bytes.Repeat([]byte{1}, 48)}}}), w.sEv, w.expect, tee.ErrMeasurement},
		// any provider
		{"unknown provider", v, func() *tee.Evidence { c := clone(w.snpEv); c.Provider = "sgx"; return c }(), w.expect, tee.ErrUnknownProvider},
	}
	seen := map[error]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.v.Verify(ctx, tc.ev, tc.expect)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			for _, s := range core.Sentinels {
				if s != tc.want && errors.Is(err, s) {
					t.Fatalf("err %v also matches %v", err, s)
				}
			}
			if res.Provider != "" {
				t.Fatalf("rejected evidence returned a result: %+v", res)
			}
			t.Log(err)
			seen[tc.want] = true
		})
	}
	t.Logf("%d negative cases, %d distinct reasons", len(cases), len(seen))
}

// A verifier keeps its own copy of the policy: changing the caller's copy
// afterwards must not widen (or narrow) what it accepts.
func TestVerifierCopiesPolicy(t *testing.T) {
	w := newWorld(t)
	p := w.policy
	p.SNP.Measurements = [][]byte{bytes.Clone(teetest.SNPMeasurement)}
	v := w.verifier(t, p)
	p.SNP.Measurements[0][0] ^= 0xFF
	if _, err := v.Verify(context.Background(), w.snpEv, w.expect); err != nil {
		t.Fatalf("verifier followed a policy change made after construction: %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	bad := []tee.Policy{
		{SNP: snp.Policy{Measurements: [][]byte{make([]byte, 32)}}},
		{SNP: snp.Policy{RevokedChipIDs: [][]byte{make([]byte, 16)}}},
		{TDX: tdx.Policy{Measurements: []tdx.Measurement{{MRTD: make([]byte, 47)}}}},
		{TDX: tdx.Policy{MinTeeTCBSVN: make([]byte, 15)}},
		{Sim: sim.Policy{Keys: []ed25519.PublicKey{make([]byte, 31)}}},
	}
	for i, p := range bad {
		if _, err := tee.NewVerifier(p); err == nil {
			t.Errorf("policy %d accepted", i)
		}
	}
	if _, err := tee.NewVerifier(tee.Policy{}); err != nil {
		t.Errorf("zero policy: %v", err)
	}
}

// The teetest helpers give other packages' tests (the election) a verifier
// that accepts the fakes and nothing else.
func TestTeetestHelpers(t *testing.T) {
	amd, err := teetest.NewAMD(teetest.AMDOptions{})
	if err != nil {
		t.Fatal(err)
	}
	intel, err := teetest.NewIntel(teetest.IntelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := tee.NewVerifier(teetest.Policy(), append(teetest.VerifierOptions(amd, intel), tee.WithLogger(quiet))...)
	if err != nil {
		t.Fatal(err)
	}
	c := tee.Claims{Swarm: swarm, IdentityKey: identityKey(t), Nonce: nonce(4), Term: 1}
	for _, a := range []tee.Attester{must(amd.Attester()), must(intel.Attester())} {
		ev, err := a.Attest(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(context.Background(), ev, c); err != nil {
			t.Fatalf("%s: %v", a.Provider(), err)
		}
	}
}

// One Verifier and one Attester per provider serve all election goroutines.
func TestConcurrentUse(t *testing.T) {
	w := newWorld(t)
	p := w.policy
	p.AllowSim = true
	v := w.verifier(t, p)
	errs := make(chan error, 12)
	for i := 0; i < 12; i++ {
		a := []tee.Attester{w.amd, w.intel, w.simAtt}[i%3]
		go func() {
			ev, err := a.Attest(context.Background(), w.expect)
			if err == nil {
				_, err = v.Verify(context.Background(), ev, w.expect)
			}
			errs <- err
		}()
	}
	for i := 0; i < 12; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
