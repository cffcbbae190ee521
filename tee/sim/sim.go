// Package sim is an INSECURE attestation provider for testnets, laptops, Macs
// and CI: it exercises the whole election protocol (binding, nonces, terms,
// rejections) on machines without a TEE.
//
// What it proves: that the holder of a testnet attestation key signed the
// claims (swarm, identity key, nonce, term). Nothing more. The key is not in
// hardware: TestnetKey derives it from the swarm name, so anyone who knows
// the swarm name can sign sim evidence for any identity, any measurement.
// A sim coordinator's memory is open to its host; its "measurement" is
// self-reported. A verifier accepts sim evidence only when its policy says
// AllowSim, and every accepted result has Insecure set, which anything that
// shows a coordinator must display.
//
// This is real code with a real Ed25519 signature check, not a bypass: a
// swarm that allows sim still rejects evidence for another key, nonce, term
// or swarm, altered reports, and reports signed by an untrusted key.
package sim

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Provider is the evidence provider name.
const Provider = core.ProviderSim

// Report layout: magic ‖ measurement ‖ report data ‖ signer key ‖ signature,
// the signature (Ed25519) covering everything before it.
const (
	magic           = "holopeer-sim-INSECURE-v1"
	MeasurementSize = 48
	ReportSize      = len(magic) + MeasurementSize + 64 + ed25519.PublicKeySize + ed25519.SignatureSize
	signedSize      = ReportSize - ed25519.SignatureSize
)

const testnetKeyDomain = "holopeer-sim-testnet-key-v1\x00"

// TestnetKey is the deterministic testnet attestation key of a swarm: every
// peer of a testnet can derive it, which is the point (no key distribution
// for testnets) and why sim evidence proves nothing.
func TestnetKey(swarm string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte(testnetKeyDomain + swarm))
	return ed25519.NewKeyFromSeed(seed[:])
}

// Attester signs sim reports with a testnet attestation key.
type Attester struct {
	key         ed25519.PrivateKey
	measurement []byte
}

// Option configures an Attester.
type Option func(*Attester) error

// WithMeasurement sets the 48-byte measurement the attester reports instead
// of the SHA-384 of its own executable.
func WithMeasurement(m []byte) Option {
	return func(a *Attester) error {
		if len(m) != MeasurementSize {
			return fmt.Errorf("sim: measurement is %d bytes, want %d", len(m), MeasurementSize)
		}
		a.measurement = bytes.Clone(m)
		return nil
	}
}

// NewAttester returns an attester that signs with key (for example
// TestnetKey(swarm), or a key published in the testnet's configuration).
func NewAttester(key ed25519.PrivateKey, opts ...Option) (*Attester, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("sim: attestation key must be an Ed25519 private key")
	}
	a := &Attester{key: key}
	for _, o := range opts {
		if err := o(a); err != nil {
			return nil, err
		}
	}
	if a.measurement == nil {
		m, err := SelfMeasurement()
		if err != nil {
			return nil, err
		}
		a.measurement = m
	}
	return a, nil
}

// Provider returns "sim".
func (a *Attester) Provider() string { return Provider }

// Attest signs a sim report over ReportData(c).
func (a *Attester) Attest(ctx context.Context, c core.Claims) (*core.Evidence, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rd := core.ReportData(c)
	r := make([]byte, 0, ReportSize)
	r = append(r, magic...)
	r = append(r, a.measurement...)
	r = append(r, rd[:]...)
	r = append(r, a.key.Public().(ed25519.PublicKey)...)
	r = append(r, ed25519.Sign(a.key, r)...)
	return &core.Evidence{Provider: Provider, Report: r, Claims: c}, nil
}

var self struct {
	once sync.Once
	m    []byte
	err  error
}

// SelfMeasurement is the SHA-384 of the running executable, computed once.
// It only labels which build a sim peer claims to run; nothing vouches for it.
func SelfMeasurement() ([]byte, error) {
	self.once.Do(func() {
		path, err := os.Executable()
		if err != nil {
			self.err = fmt.Errorf("sim: find own executable: %w", err)
			return
		}
		f, err := os.Open(path)
		if err != nil {
			self.err = fmt.Errorf("sim: read own executable: %w", err)
			return
		}
		defer f.Close()
		h := sha512.New384()
		if _, err := io.Copy(h, f); err != nil {
			self.err = fmt.Errorf("sim: hash own executable: %w", err)
			return
		}
		self.m = h.Sum(nil)
	})
	return bytes.Clone(self.m), self.err
}

// Policy is what a swarm that allows sim accepts.
type Policy struct {
	// Keys are the trusted testnet attestation public keys. Empty means the
	// swarm's TestnetKey.
	Keys []ed25519.PublicKey `json:"keys,omitempty"`
	// Measurements, if not empty, is an allowlist of reported measurements
	// (useful to exercise measurement policies on a testnet; proves nothing).
	Measurements [][]byte `json:"measurements,omitempty"`
}

// Verify checks sim evidence against the claims the caller expects (it
// recomputes their report data; it never trusts ev.Claims). Callers go
// through tee.Verifier, which first refuses sim unless the policy allows it.
func Verify(ev *core.Evidence, expect core.Claims, p Policy) (core.Result, error) {
	reportData := core.ReportData(expect)
	r := ev.Report
	if len(r) != ReportSize || string(r[:len(magic)]) != magic {
		return core.Result{}, fmt.Errorf("%w: not a sim report (%d bytes)", core.ErrMalformed, len(r))
	}
	if len(ev.Certs) != 0 {
		return core.Result{}, fmt.Errorf("%w: sim evidence carries no certificates", core.ErrMalformed)
	}
	off := len(magic)
	measurement := r[off : off+MeasurementSize]
	off += MeasurementSize
	rd := r[off : off+64]
	off += 64
	signer := ed25519.PublicKey(r[off : off+ed25519.PublicKeySize])
	sig := r[signedSize:]

	trusted := p.Keys
	if len(trusted) == 0 {
		trusted = []ed25519.PublicKey{TestnetKey(expect.Swarm).Public().(ed25519.PublicKey)}
	}
	known := false
	for _, k := range trusted {
		known = known || k.Equal(signer)
	}
	if !known {
		return core.Result{}, fmt.Errorf("%w: sim report signed by untrusted key %x", core.ErrUntrustedRoot, []byte(signer))
	}
	if !ed25519.Verify(signer, r[:signedSize], sig) {
		return core.Result{}, fmt.Errorf("%w: sim report", core.ErrSignature)
	}
	if !bytes.Equal(rd, reportData[:]) {
		return core.Result{}, fmt.Errorf("%w: sim report data %x…", core.ErrBindingMismatch, rd[:8])
	}
	res := core.Result{Provider: Provider, Insecure: true, Measurement: bytes.Clone(measurement)}
	if len(p.Measurements) > 0 && !contains(p.Measurements, measurement) {
		return res, fmt.Errorf("%w: sim measurement %x", core.ErrMeasurement, measurement)
	}
	return res, nil
}

func contains(list [][]byte, v []byte) bool {
	for _, x := range list {
		if bytes.Equal(x, v) {
			return true
		}
	}
	return false
}
