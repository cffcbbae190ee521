package tee_test

import (
	"context"
	"errors"
	"testing"

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
