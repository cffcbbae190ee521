package core

import "errors"

// Sentinel errors. Every rejection the verifier returns wraps exactly one of
// them, so callers (the election, logs, tests) can tell the reasons apart
// with errors.Is. They are re-exported by package tee.
var (
	// ErrMalformed: the evidence bytes or a report inside them do not parse,
	// or a field is outside its bounds.
	ErrMalformed = errors.New("tee: malformed evidence")
	// ErrUnknownProvider: the evidence names a provider this build cannot verify.
	ErrUnknownProvider = errors.New("tee: unknown provider")
	// ErrSimNotAllowed: sim evidence offered to a swarm that does not allow it.
	ErrSimNotAllowed = errors.New("tee: sim (INSECURE) evidence not allowed by policy")
	// ErrSwarmMismatch: the evidence is for another swarm.
	ErrSwarmMismatch = errors.New("tee: evidence is for another swarm")
	// ErrIdentityMismatch: the evidence claims another identity key than the
	// peer we are talking to.
	ErrIdentityMismatch = errors.New("tee: evidence is for another identity key")
	// ErrTermMismatch: the evidence is for another election term.
	ErrTermMismatch = errors.New("tee: evidence is for another term")
	// ErrStaleNonce: the evidence answers another (old) nonce: a replay.
	ErrStaleNonce = errors.New("tee: evidence answers a stale or foreign nonce")
	// ErrBindingMismatch: the hardware report's REPORT_DATA is not the
	// binding the verifier recomputed from the expected claims.
	ErrBindingMismatch = errors.New("tee: report data does not bind the expected claims")
	// ErrUntrustedRoot: the report's certificate chain does not lead to a
	// trusted root (AMD, Intel, or a trusted sim key) at the verification time.
	ErrUntrustedRoot = errors.New("tee: certificate chain does not lead to a trusted root")
	// ErrSignature: the chain is trusted but the report's signature does not
	// verify: the report was altered.
	ErrSignature = errors.New("tee: report signature invalid")
	// ErrDebug: the guest can be debugged (its memory read by the host).
	ErrDebug = errors.New("tee: debug-enabled guest")
	// ErrMeasurement: the launch measurement is not on the policy's allowlist.
	ErrMeasurement = errors.New("tee: measurement not allowed by policy")
	// ErrTCB: firmware or microcode security versions below the policy minimum.
	ErrTCB = errors.New("tee: TCB below policy minimum")
	// ErrRevoked: the chip or platform is on the policy's revocation list.
	ErrRevoked = errors.New("tee: chip revoked by policy")
	// ErrPolicy: another policy check of the provider failed (VMPL, guest
	// policy bits, inconsistent TCB fields, ...).
	ErrPolicy = errors.New("tee: report violates policy")
	// ErrNoTEE: this machine has no trusted execution environment to attest with.
	ErrNoTEE = errors.New("tee: no TEE available on this machine")
)

// Sentinels lists every sentinel above, for tests that check each rejection
// carries exactly one reason.
var Sentinels = []error{
	ErrMalformed, ErrUnknownProvider, ErrSimNotAllowed, ErrSwarmMismatch,
	ErrIdentityMismatch, ErrTermMismatch, ErrStaleNonce, ErrBindingMismatch,
	ErrUntrustedRoot, ErrSignature, ErrDebug, ErrMeasurement, ErrTCB,
	ErrRevoked, ErrPolicy, ErrNoTEE,
}
