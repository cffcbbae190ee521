package main

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/peer/ledger"
)

type ledgerIdent struct {
	key crypto.PrivKey
	id  string
}

func newLedgerIdent(t *testing.T) ledgerIdent {
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return ledgerIdent{k, id.String()}
}

// runLedger runs the built binary and returns its output and exit status.
func runLedger(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"ledger"}, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// TestLedgerCommands writes a node's ledger as a coordinator's issuer and a
// node's store would (real keys, real signatures), then checks what
// `holopeer ledger top` and `verify` make of it, before and after a forged
// and a tampered receipt are slipped into the file.
func TestLedgerCommands(t *testing.T) {
	dataDir := t.TempDir()
	coord, a, b, c, mallory := newLedgerIdent(t), newLedgerIdent(t), newLedgerIdent(t), newLedgerIdent(t), newLedgerIdent(t)
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	l, err := ledger.Open(dataDir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RecordTerm(ledger.TermRecord{Term: 4, Coordinator: coord.id, TEE: "sim", Insecure: true, AcceptedAt: t0}); err != nil {
		t.Fatal(err)
	}
	is, _ := ledger.NewIssuer(coord.key, "lab", 0)
	for s := 0; s <= 120; s += 5 {
		at := t0.Add(time.Duration(s) * time.Second)
		for _, p := range []ledgerIdent{a, b, c} {
			is.Seen(p.id, at)
		}
		if s > 0 {
			is.Work(a.id, "job-1", int64(s/5-1), int64(s/5), 4, 2048)
			is.Work(b.id, "job-1", int64(s/5-1), int64(s/5), 3, 2048)
		}
		if s%60 == 0 && s > 0 {
			rs, err := is.Issue(4, at)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				if _, err := l.Add(r); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	good := l.Store().Receipts()
	srv := httptest.NewServer(l.Handler())
	defer srv.Close()

	out, stderr, code := runLedger(t, "top", "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("top: exit %d\n%s%s", code, out, stderr)
	}
	for _, p := range []ledgerIdent{a, b, c} {
		if !strings.Contains(out, p.id) {
			t.Errorf("top does not list %s:\n%s", p.id, out)
		}
	}
	if !strings.Contains(out, "INSECURE") {
		t.Errorf("top does not say the credit came from a sim term:\n%s", out)
	}
	out, _, code = runLedger(t, "top", "--data-dir", dataDir, "--json")
	var top []struct {
		PeerID string  `json:"peer_id"`
		Points float64 `json:"points"`
	}
	if err := json.Unmarshal([]byte(out), &top); err != nil || code != 0 || len(top) != 3 {
		t.Fatalf("top --json: exit %d, %v: %s", code, err, out)
	}
	for _, e := range top {
		if e.Points <= 0 {
			t.Errorf("%s has %v points", e.PeerID, e.Points)
		}
	}
	if top[0].PeerID != a.id {
		t.Errorf("a did most work but ranks below %s", top[0].PeerID)
	}
	if out, stderr, code = runLedger(t, "verify", "--api", strings.TrimPrefix(srv.URL, "http://")); code != 0 || !strings.Contains(out, "0 rejected") {
		t.Fatalf("verify --api: exit %d\n%s%s", code, out, stderr)
	}

	// Slip a tampered and a forged receipt into the node's file.
	var tampered ledger.Receipt
	for _, r := range good {
		if r.Tokens > 0 {
			tampered = r
		}
	}
	tampered.Tokens *= 100
	forged, err := ledger.Sign(ledger.Receipt{Swarm: "lab", Term: 4, Peer: mallory.id, JobID: "job-1", FromStep: 1000, ToStep: 2000,
		PeriodStart: t0, PeriodEnd: t0.Add(time.Hour), ComputeS: 3600, Tokens: 1 << 30, IssuedAt: t0.Add(time.Hour)}, mallory.key)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(ledger.Dir(dataDir), ledger.ReceiptsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []ledger.Receipt{tampered, forged} {
		b, _ := r.Encode()
		f.Write(append(b, '\n'))
	}
	f.Close()

	out, stderr, code = runLedger(t, "verify", "--data-dir", dataDir)
	if code != 3 {
		t.Fatalf("verify with bad receipts: exit %d, want 3\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"2 rejected", "bad signature", "was not the coordinator", "2 of "} {
		if !strings.Contains(out+stderr, want) {
			t.Errorf("verify output lacks %q:\n%s%s", want, out, stderr)
		}
	}
	out, _, _ = runLedger(t, "verify", "--data-dir", dataDir, "--peer", mallory.id, "--json")
	var rep struct {
		Totals   []json.RawMessage `json:"totals"`
		Rejected []struct {
			Reason string `json:"reason"`
		} `json:"rejected"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Totals) != 0 || len(rep.Rejected) != 1 {
		t.Fatalf("verify --peer mallory: %v\n%s", err, out)
	}
	// Totals are unchanged by the bad receipts.
	out, _, _ = runLedger(t, "top", "--data-dir", dataDir, "--json")
	var after []struct {
		PeerID string  `json:"peer_id"`
		Points float64 `json:"points"`
	}
	json.Unmarshal([]byte(out), &after)
	if len(after) != 3 || after[0] != top[0] {
		t.Errorf("bad receipts changed the totals: %+v then %+v", top, after)
	}

	if _, stderr, code = runLedger(t, "verify", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(stderr, "data dir") {
		t.Errorf("an empty data dir: exit %d, %s", code, stderr)
	}
	l.Close()
}
