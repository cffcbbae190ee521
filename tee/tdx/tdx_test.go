package tdx_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	tdxtestdata "github.com/google/go-tdx-guest/testing/testdata"
	"github.com/google/go-tdx-guest/verify"

	"github.com/holopeer/holopeer/tee/internal/core"
	"github.com/holopeer/holopeer/tee/tdx"
	"github.com/holopeer/holopeer/tee/teetest"
)

func claims() core.Claims {
	return core.Claims{Swarm: "tdx-test", IdentityKey: []byte("identity-key-bytes"), Nonce: bytes.Repeat([]byte{7}, 32), Term: 11}
}

func policy() tdx.Policy {
	return tdx.Policy{Measurements: []tdx.Measurement{{MRTD: teetest.TDXMRTD, RTMRs: teetest.TDXRTMRs}}}
}

func TestFakeIntelAccepted(t *testing.T) {
	intel, err := teetest.NewIntel(teetest.IntelOptions{QESVN: 8, PCESVN: 13})
	if err != nil {
		t.Fatal(err)
	}
	a, err := intel.Attester()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := a.Attest(context.Background(), claims())
	if err != nil {
		t.Fatal(err)
	}
	p := policy()
	p.MinTeeTCBSVN = bytes.Repeat([]byte{3}, 16)
	p.MinQESVN, p.MinPCESVN = 8, 13
	res, err := tdx.Verify(context.Background(), ev, claims(), p, intel.Roots(), time.Now())
	if err != nil {
		t.Fatalf("good quote rejected: %v", err)
	}
	if !bytes.Equal(res.Measurement, teetest.TDXMRTD) || !bytes.Equal(res.ChipID, teetest.TDXPPID) || res.Insecure {
		t.Fatalf("result %+v", res)
	}
	t.Logf("%s (quote %d bytes)", res, len(ev.Report))
}

// Golden: Intel's real production sample quote (go-tdx-guest test data)
// passes the chain and signature steps against our embedded Intel root, and
// then stops at the binding (its REPORT_DATA is not ours). This also proves
// the embedded root is Intel's.
func TestRealIntelQuoteAgainstProductionRoot(t *testing.T) {
	q, err := abi.QuoteToProto(tdxtestdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := verify.ExtractChainFromQuote(q.(*pb.QuoteV4))
	if err != nil {
		t.Fatal(err)
	}
	ev := &core.Evidence{Provider: tdx.Provider, Report: tdxtestdata.RawQuote, Claims: claims()}
	at := chain.PCKCertificate.NotBefore.Add(time.Hour)
	_, err = tdx.Verify(context.Background(), ev, claims(), policy(), nil, at)
	if !errors.Is(err, core.ErrBindingMismatch) {
		t.Fatalf("real quote: err = %v, want it to pass chain and signatures and stop at the binding", err)
	}
}
