package tee_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/tee"
)

// This machine (and CI) has no SEV-SNP or TDX: auto must say so plainly and
// must not fall back to sim.
func TestDetectWithoutTEE(t *testing.T) {
	a, err := tee.Detect(context.Background())
	if err == nil {
		t.Skipf("this machine offers a %s TEE; nothing to check", a.Provider())
	}
	if !errors.Is(err, tee.ErrNoTEE) {
		t.Fatalf("err = %v, want ErrNoTEE", err)
	}
	t.Logf("auto: %v", err)
	if _, err := tee.NewAttester(context.Background(), tee.ModeAuto); !errors.Is(err, tee.ErrNoTEE) {
		t.Fatalf("ModeAuto err = %v, want ErrNoTEE", err)
	}
}

func TestModes(t *testing.T) {
	for _, s := range []string{"auto", "snp", "tdx", "sim", "none"} {
		if _, err := tee.ParseMode(s); err != nil {
			t.Errorf("ParseMode(%q): %v", s, err)
		}
	}
	if _, err := tee.ParseMode("sgx"); err == nil {
		t.Error("ParseMode accepted sgx")
	}
	a, err := tee.NewAttester(context.Background(), tee.ModeNone)
	if a != nil || err != nil {
		t.Fatalf("ModeNone = %v, %v; want nil, nil", a, err)
	}
	if _, err := tee.NewAttester(context.Background(), tee.ModeSim); err == nil {
		t.Fatal("sim without a key accepted")
	}
	a, err = tee.NewAttester(context.Background(), tee.ModeSim, tee.WithSimKey(tee.SimTestnetKey("t")))
	if err != nil || a.Provider() != tee.ProviderSim {
		t.Fatalf("sim attester: %v, %v", a, err)
	}
}

func TestNewClaimsAndPeerID(t *testing.T) {
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tee.NewClaims("s", pub, make([]byte, 32), 1)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := peer.IDFromPublicKey(pub)
	if got, err := c.PeerID(); err != nil || got != want {
		t.Fatalf("PeerID = %s, %v; want %s", got, err, want)
	}
	if _, err := tee.NewClaims("s", pub, make([]byte, 8), 1); !errors.Is(err, tee.ErrMalformed) {
		t.Fatalf("short nonce: %v", err)
	}
	bad := c
	bad.IdentityKey = []byte("not a key")
	if _, err := bad.PeerID(); !errors.Is(err, tee.ErrMalformed) {
		t.Fatalf("bad key: %v", err)
	}
}
