package tee

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/holopeer/holopeer/tee/internal/core"
	"github.com/holopeer/holopeer/tee/sim"
	"github.com/holopeer/holopeer/tee/snp"
	"github.com/holopeer/holopeer/tee/tdx"
)

// Policy is what a swarm accepts from coordinator candidates. The zero
// Policy accepts nothing: SNP and TDX need allowed measurements, and sim
// needs AllowSim.
type Policy struct {
	// AllowSim accepts the INSECURE sim provider. Set it only on testnets
	// whose operator chose so explicitly.
	AllowSim bool       `json:"allow_sim,omitempty"`
	SNP      snp.Policy `json:"snp"`
	TDX      tdx.Policy `json:"tdx"`
	Sim      sim.Policy `json:"sim"`
}

// Validate checks the sizes of every value in the policy.
func (p Policy) Validate() error {
	check := func(what string, list [][]byte, size int) error {
		for i, b := range list {
			if len(b) != size {
				return fmt.Errorf("tee: policy %s[%d] is %d bytes, want %d", what, i, len(b), size)
			}
		}
		return nil
	}
	errs := []error{
		check("snp.measurements", p.SNP.Measurements, 48),
		check("snp.revoked_chip_ids", p.SNP.RevokedChipIDs, 64),
		check("tdx.revoked_chip_ids", p.TDX.RevokedChipIDs, 16),
		check("sim.measurements", p.Sim.Measurements, sim.MeasurementSize),
	}
	for i, m := range p.TDX.Measurements {
		errs = append(errs, check(fmt.Sprintf("tdx.measurements[%d].mrtd", i), [][]byte{m.MRTD}, 48))
		for j, r := range m.RTMRs {
			if r != nil {
				errs = append(errs, check(fmt.Sprintf("tdx.measurements[%d].rtmrs[%d]", i, j), [][]byte{r}, 48))
			}
		}
	}
	if p.TDX.MinTeeTCBSVN != nil {
		errs = append(errs, check("tdx.min_tee_tcb_svn", [][]byte{p.TDX.MinTeeTCBSVN}, 16))
	}
	for i, k := range p.Sim.Keys {
		if len(k) != ed25519.PublicKeySize {
			errs = append(errs, fmt.Errorf("tee: policy sim.keys[%d] is %d bytes, want %d", i, len(k), ed25519.PublicKeySize))
		}
	}
	return errors.Join(errs...)
}

// Verifier checks evidence against a policy. It is immutable and safe for
// concurrent use. Verification is offline: it never fetches certificates,
// CRLs or collateral.
type Verifier struct {
	policy   Policy
	snpRoots snp.Roots
	tdxRoots *x509.CertPool
	now      func() time.Time
	log      *slog.Logger
}

// Option configures a Verifier.
type Option func(*Verifier) error

// WithSNPRoots replaces AMD's roots embedded in go-sev-guest. Only tests
// use it, with the fake AMD chain from tee/teetest.
func WithSNPRoots(r snp.Roots) Option {
	return func(v *Verifier) error {
		if len(r) == 0 {
			return errors.New("tee: empty SNP roots")
		}
		v.snpRoots = r
		return nil
	}
}

// WithTDXRoots replaces the Intel SGX Root CA. Only tests use it, with the
// fake Intel chain from tee/teetest.
func WithTDXRoots(pool *x509.CertPool) Option {
	return func(v *Verifier) error {
		if pool == nil {
			return errors.New("tee: nil TDX roots")
		}
		v.tdxRoots = pool
		return nil
	}
}

// WithClock sets the time certificates must be valid at (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(v *Verifier) error {
		if now == nil {
			return errors.New("tee: nil clock")
		}
		v.now = now
		return nil
	}
}

// WithLogger sets where accepted INSECURE (sim) evidence is reported at WARN
// level (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(v *Verifier) error {
		if l == nil {
			return errors.New("tee: nil logger")
		}
		v.log = l
		return nil
	}
}

// NewVerifier returns a verifier for policy with AMD's and Intel's
// production roots unless options say otherwise.
func NewVerifier(policy Policy, opts ...Option) (*Verifier, error) {
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	v := &Verifier{policy: policy.clone(), tdxRoots: tdx.ProductionRoots(), now: time.Now, log: slog.Default()}
	for _, o := range opts {
		if err := o(v); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// Policy returns a copy of the verifier's policy.
func (v *Verifier) Policy() Policy { return v.policy.clone() }

// clone deep-copies p so that a Verifier never shares memory with its
// caller: changing a policy after NewVerifier changes nothing.
func (p Policy) clone() Policy {
	c := p
	c.SNP.Measurements = cloneAll(p.SNP.Measurements)
	c.SNP.RevokedChipIDs = cloneAll(p.SNP.RevokedChipIDs)
	c.TDX.Measurements = nil
	for _, m := range p.TDX.Measurements {
		n := tdx.Measurement{MRTD: bytes.Clone(m.MRTD)}
		for i, r := range m.RTMRs {
			n.RTMRs[i] = bytes.Clone(r)
		}
		c.TDX.Measurements = append(c.TDX.Measurements, n)
	}
	c.TDX.MinTeeTCBSVN = bytes.Clone(p.TDX.MinTeeTCBSVN)
	c.TDX.RevokedChipIDs = cloneAll(p.TDX.RevokedChipIDs)
	c.Sim.Measurements = cloneAll(p.Sim.Measurements)
	c.Sim.Keys = nil
	for _, k := range p.Sim.Keys {
		c.Sim.Keys = append(c.Sim.Keys, ed25519.PublicKey(bytes.Clone(k)))
	}
	return c
}

func cloneAll(list [][]byte) [][]byte {
	if list == nil {
		return nil
	}
	out := make([][]byte, len(list))
	for i, b := range list {
		out[i] = bytes.Clone(b)
	}
	return out
}

// Verify checks ev against the claims the caller expects — the identity
// key of the peer on the authenticated stream, the swarm, and the nonce and
// term of the election — and the policy. Cheap checks run before any
// cryptography, so an unauthenticated message costs little:
//
//  1. shape and bounds (ErrMalformed), provider (ErrUnknownProvider), sim
//     allowed (ErrSimNotAllowed);
//  2. claims: swarm (ErrSwarmMismatch), identity key (ErrIdentityMismatch),
//     term (ErrTermMismatch), nonce (ErrStaleNonce);
//  3. the provider's chain (ErrUntrustedRoot) and signature (ErrSignature);
//  4. REPORT_DATA against ReportData(expect), recomputed here
//     (ErrBindingMismatch);
//  5. policy: debug (ErrDebug), revocation (ErrRevoked), measurement
//     (ErrMeasurement), TCB (ErrTCB), the rest (ErrPolicy).
//
// Each failure wraps exactly one of those sentinels (or is ctx's error; an
// invalid expect is ErrMalformed). On success the Result says what was
// attested; Result.Insecure is true exactly for sim.
func (v *Verifier) Verify(ctx context.Context, ev *Evidence, expect Claims) (Result, error) {
	if ev == nil {
		return Result{}, fmt.Errorf("%w: nil evidence", ErrMalformed)
	}
	if err := ev.Validate(); err != nil {
		return Result{}, err
	}
	if err := expect.Validate(); err != nil {
		return Result{}, fmt.Errorf("expected claims: %w", err)
	}
	switch ev.Provider {
	case ProviderSNP, ProviderTDX:
	case ProviderSim:
		if !v.policy.AllowSim {
			return Result{}, ErrSimNotAllowed
		}
	default:
		return Result{}, fmt.Errorf("%w: %q", ErrUnknownProvider, ev.Provider)
	}
	if err := compareClaims(ev.Claims, expect); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	var (
		res Result
		err error
	)
	switch ev.Provider {
	case ProviderSNP:
		res, err = snp.Verify(ctx, ev, expect, v.policy.SNP, v.snpRoots, v.now())
	case ProviderTDX:
		res, err = tdx.Verify(ctx, ev, expect, v.policy.TDX, v.tdxRoots, v.now())
	case ProviderSim:
		res, err = sim.Verify(ev, expect, v.policy.Sim)
		if err == nil {
			v.log.Warn("accepted INSECURE sim attestation: a testnet key signed it, no hardware vouches for it",
				"swarm", expect.Swarm, "term", expect.Term)
		}
	}
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

func compareClaims(got, want core.Claims) error {
	switch {
	case got.Swarm != want.Swarm:
		return fmt.Errorf("%w: evidence for %q, expected %q", ErrSwarmMismatch, got.Swarm, want.Swarm)
	case !equal(got.IdentityKey, want.IdentityKey):
		return ErrIdentityMismatch
	case got.Term != want.Term:
		return fmt.Errorf("%w: evidence for term %d, expected %d", ErrTermMismatch, got.Term, want.Term)
	case !equal(got.Nonce, want.Nonce):
		return ErrStaleNonce
	}
	return nil
}

func equal(a, b []byte) bool { return string(a) == string(b) }
