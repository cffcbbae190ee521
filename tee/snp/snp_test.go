package snp_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	sevtestdata "github.com/google/go-sev-guest/verify/testdata"
	"github.com/google/uuid"

	"github.com/holopeer/holopeer/tee/internal/core"
	"github.com/holopeer/holopeer/tee/snp"
	"github.com/holopeer/holopeer/tee/teetest"
)

func claims() core.Claims {
	return core.Claims{Swarm: "snp-test", IdentityKey: []byte("identity-key-bytes"), Nonce: bytes.Repeat([]byte{9}, 32), Term: 3}
}

func policy() snp.Policy {
	return snp.Policy{Measurements: [][]byte{teetest.SNPMeasurement}}
}

func TestFakeAMDAccepted(t *testing.T) {
	amd, err := teetest.NewAMD(teetest.AMDOptions{TCB: kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := amd.Attester()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := a.Attest(context.Background(), claims())
	if err != nil {
		t.Fatal(err)
	}
	p := policy()
	p.MinTCB = kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 100}
	res, err := snp.Verify(context.Background(), ev, claims(), p, amd.Roots(), time.Now())
	if err != nil {
		t.Fatalf("good evidence rejected: %v", err)
	}
	if res.Insecure || !bytes.Equal(res.Measurement, teetest.SNPMeasurement) || !bytes.Equal(res.ChipID, teetest.SNPChipID) {
		t.Fatalf("result %+v", res)
	}
	t.Logf("%s (evidence report %d bytes, %d cert entries)", res, len(ev.Report), len(ev.Certs))
}

// The attester fetches a VCEK the host did not provide from (fake) AMD KDS,
// and ships it, so the verifier stays offline.
func TestVCEKFetchedFromKDS(t *testing.T) {
	amd, err := teetest.NewAMD(teetest.AMDOptions{OmitVCEK: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := amd.Attester()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := a.Attest(context.Background(), claims())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snp.Verify(context.Background(), ev, claims(), policy(), amd.Roots(), time.Now()); err != nil {
		t.Fatalf("evidence with fetched VCEK rejected: %v", err)
	}
	// Without KDS the attester says why instead of producing evidence no one can check.
	noKDS, err := snp.NewAttester(snp.WithQuoteProvider(amd), snp.WithKDSGetter(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noKDS.Attest(context.Background(), claims()); err == nil {
		t.Fatal("attested without any VCEK")
	}
}

// Golden: a real Milan report signed by a real VCEK (go-sev-guest's test
// data) passes the chain and signature steps against AMD's embedded roots;
// its REPORT_DATA is not ours, so it then fails at the binding step.
func TestRealAMDReportAgainstProductionRoots(t *testing.T) {
	g := uuid.MustParse(abi.VcekGUID)
	ev := &core.Evidence{
		Provider: snp.Provider,
		Report:   sevtestdata.AttestationBytes,
		Certs:    [][]byte{append(g[:], sevtestdata.VcekBytes...)},
		Claims:   claims(),
	}
	at := time.Date(2022, time.September, 24, 1, 0, 0, 0, time.UTC) // inside the VCEK's validity
	_, err := snp.Verify(context.Background(), ev, claims(), policy(), nil, at)
	if !errors.Is(err, core.ErrBindingMismatch) {
		t.Fatalf("real report: err = %v, want it to pass chain and signature and stop at the binding", err)
	}
}
