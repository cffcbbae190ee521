package tee

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/holopeer/holopeer/tee/sim"
	"github.com/holopeer/holopeer/tee/snp"
	"github.com/holopeer/holopeer/tee/tdx"
)

// Mode is the value of `holopeer up --tee`.
type Mode string

const (
	ModeAuto Mode = "auto" // SEV-SNP or TDX if this machine has one; never sim
	ModeSNP  Mode = "snp"
	ModeTDX  Mode = "tdx"
	ModeSim  Mode = "sim"  // INSECURE testnet provider
	ModeNone Mode = "none" // do not attest: vote and compute, never coordinate
)

// ParseMode accepts auto, snp, tdx, sim and none.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeSNP, ModeTDX, ModeSim, ModeNone:
		return m, nil
	}
	return "", fmt.Errorf("tee: unknown mode %q (want auto, snp, tdx, sim or none)", s)
}

type attesterConfig struct {
	simKey ed25519.PrivateKey
}

// AttesterOption configures NewAttester.
type AttesterOption func(*attesterConfig) error

// WithSimKey is the testnet attestation key ModeSim signs with, for example
// SimTestnetKey(swarm) or a key from the testnet's configuration.
func WithSimKey(key ed25519.PrivateKey) AttesterOption {
	return func(c *attesterConfig) error {
		if len(key) != ed25519.PrivateKeySize {
			return errors.New("tee: sim key must be an Ed25519 private key")
		}
		c.simKey = key
		return nil
	}
}

// NewAttester opens the attester a mode names. ModeNone returns (nil, nil):
// the peer does not attest and never stands as coordinator. A mode this
// machine cannot serve returns an error wrapping ErrNoTEE. ModeSim needs
// WithSimKey.
func NewAttester(ctx context.Context, mode Mode, opts ...AttesterOption) (Attester, error) {
	var c attesterConfig
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	switch mode {
	case ModeNone:
		return nil, nil
	case ModeAuto:
		return Detect(ctx)
	case ModeSNP:
		return snp.NewAttester()
	case ModeTDX:
		return tdx.NewAttester()
	case ModeSim:
		if c.simKey == nil {
			return nil, errors.New("tee: sim mode needs a testnet key (WithSimKey)")
		}
		return sim.NewAttester(c.simKey)
	}
	return nil, fmt.Errorf("tee: unknown mode %q", mode)
}

// Detect returns the hardware attester this machine offers: SEV-SNP, else
// TDX. With neither it returns an error wrapping ErrNoTEE that says what was
// tried. It never falls back to sim.
func Detect(ctx context.Context) (Attester, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a, snpErr := snp.NewAttester()
	if snpErr == nil {
		return a, nil
	}
	t, tdxErr := tdx.NewAttester()
	if tdxErr == nil {
		return t, nil
	}
	return nil, fmt.Errorf("%w (tried %s; %s)", ErrNoTEE, unwrapNoTEE(snpErr), unwrapNoTEE(tdxErr))
}

// unwrapNoTEE drops the repeated "no TEE" prefix from a provider's error.
func unwrapNoTEE(err error) string {
	s := err.Error()
	prefix := ErrNoTEE.Error() + ": "
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return s
}
