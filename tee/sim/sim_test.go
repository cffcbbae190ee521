package sim

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/holopeer/holopeer/tee/internal/core"
)

func claims() core.Claims {
	return core.Claims{Swarm: "sim-test", IdentityKey: []byte("k"), Nonce: bytes.Repeat([]byte{3}, 32), Term: 1}
}

func TestTestnetKeyIsPerSwarmAndStable(t *testing.T) {
	if !TestnetKey("a").Equal(TestnetKey("a")) {
		t.Fatal("testnet key not deterministic")
	}
	if TestnetKey("a").Equal(TestnetKey("b")) {
		t.Fatal("two swarms share a testnet key")
	}
}

func TestAttestVerify(t *testing.T) {
	m := bytes.Repeat([]byte{1}, MeasurementSize)
	a, err := NewAttester(TestnetKey("sim-test"), WithMeasurement(m))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := a.Attest(context.Background(), claims())
	if err != nil {
		t.Fatal(err)
	}
	res, err := Verify(ev, claims(), Policy{})
	if err != nil || !res.Insecure || !bytes.Equal(res.Measurement, m) {
		t.Fatalf("Verify = %+v, %v", res, err)
	}
	// A configured key replaces the derived one.
	_, other, _ := ed25519.GenerateKey(nil)
	if _, err := Verify(ev, claims(), Policy{Keys: []ed25519.PublicKey{other.Public().(ed25519.PublicKey)}}); !errors.Is(err, core.ErrUntrustedRoot) {
		t.Fatalf("untrusted key: %v", err)
	}
	// The key derived from another swarm name is not trusted either.
	other2 := claims()
	other2.Swarm = "elsewhere"
	if _, err := Verify(ev, other2, Policy{}); !errors.Is(err, core.ErrUntrustedRoot) {
		t.Fatalf("other swarm's key: %v", err)
	}
	short := *ev
	short.Report = ev.Report[:ReportSize-1]
	if _, err := Verify(&short, claims(), Policy{}); !errors.Is(err, core.ErrMalformed) {
		t.Fatalf("short report: %v", err)
	}
	withCert := *ev
	withCert.Certs = [][]byte{{1}}
	if _, err := Verify(&withCert, claims(), Policy{}); !errors.Is(err, core.ErrMalformed) {
		t.Fatalf("certificates on sim evidence: %v", err)
	}
}

func TestOptions(t *testing.T) {
	if _, err := NewAttester(nil); err == nil {
		t.Error("nil key accepted")
	}
	if _, err := NewAttester(TestnetKey("x"), WithMeasurement([]byte{1})); err == nil {
		t.Error("short measurement accepted")
	}
	a, err := NewAttester(TestnetKey("x")) // measures its own executable
	if err != nil || len(a.measurement) != MeasurementSize {
		t.Fatalf("self-measured attester: %v", err)
	}
}
