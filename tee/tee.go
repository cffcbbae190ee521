package tee

import (
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/holopeer/holopeer/tee/internal/core"
	"github.com/holopeer/holopeer/tee/sim"
)

// Claims are what evidence vouches for: swarm, identity key, nonce, term.
type Claims = core.Claims

// Evidence is a provider's report over ReportData(Claims) plus the
// certificates to check it offline.
type Evidence = core.Evidence

// Result describes verified evidence; Insecure is true exactly for sim.
type Result = core.Result

// Attester produces evidence on this machine.
type Attester = core.Attester

// Provider names.
const (
	ProviderSNP = core.ProviderSNP
	ProviderTDX = core.ProviderTDX
	ProviderSim = core.ProviderSim
)

// Bounds (bytes).
const (
	MaxEvidenceBytes    = core.MaxEvidenceBytes
	MaxSwarmBytes       = core.MaxSwarmBytes
	MaxIdentityKeyBytes = core.MaxIdentityKeyBytes
	MinNonceBytes       = core.MinNonceBytes
	MaxNonceBytes       = core.MaxNonceBytes
)

// NewClaims builds claims for a libp2p identity key (marshalled as
// crypto.MarshalPublicKey does, the bytes its peer ID is derived from) and
// checks their bounds.
func NewClaims(swarm string, identity crypto.PubKey, nonce []byte, term uint64) (Claims, error) {
	if identity == nil {
		return Claims{}, fmt.Errorf("%w: nil identity key", ErrMalformed)
	}
	key, err := crypto.MarshalPublicKey(identity)
	if err != nil {
		return Claims{}, fmt.Errorf("tee: marshal identity key: %w", err)
	}
	c := Claims{Swarm: swarm, IdentityKey: key, Nonce: nonce, Term: term}
	return c, c.Validate()
}

// ReportData is the 64-byte binding of claims placed in REPORT_DATA:
// SHA-512("holopeer-tee-v1" ‖ 0x00 ‖ lp(swarm) ‖ lp(key) ‖ lp(nonce) ‖ u64be(term)).
func ReportData(c Claims) [64]byte { return core.ReportData(c) }

// UnmarshalEvidence decodes evidence from the wire, checking every size
// before allocating (at most MaxEvidenceBytes). It verifies nothing.
func UnmarshalEvidence(b []byte) (*Evidence, error) { return core.UnmarshalEvidence(b) }

// SimTestnetKey is the deterministic INSECURE testnet attestation key of a
// swarm (see package tee/sim).
var SimTestnetKey = sim.TestnetKey

// Rejection reasons; every verification error wraps exactly one.
var (
	ErrMalformed        = core.ErrMalformed
	ErrUnknownProvider  = core.ErrUnknownProvider
	ErrSimNotAllowed    = core.ErrSimNotAllowed
	ErrSwarmMismatch    = core.ErrSwarmMismatch
	ErrIdentityMismatch = core.ErrIdentityMismatch
	ErrTermMismatch     = core.ErrTermMismatch
	ErrStaleNonce       = core.ErrStaleNonce
	ErrBindingMismatch  = core.ErrBindingMismatch
	ErrUntrustedRoot    = core.ErrUntrustedRoot
	ErrSignature        = core.ErrSignature
	ErrDebug            = core.ErrDebug
	ErrMeasurement      = core.ErrMeasurement
	ErrTCB              = core.ErrTCB
	ErrRevoked          = core.ErrRevoked
	ErrPolicy           = core.ErrPolicy
	// ErrNoTEE: this machine cannot attest (from NewAttester and Detect).
	ErrNoTEE = core.ErrNoTEE
)
