package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// recordWorld opens a ledger in a fresh data dir with w's terms recorded.
func recordWorld(t *testing.T, w world, opts ...StoreOption) *Ledger {
	t.Helper()
	l, err := Open(t.TempDir(), "lab", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	for _, r := range w.hist.Records() {
		if err := l.RecordTerm(r); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// A key that coordinated nothing floods receipts of made-up terms: none is
// stored, so none takes room from genuine ones.
func TestAttackUnknownTermFloodIsRefused(t *testing.T) {
	w := newWorld(t)
	var reasons []string
	l := recordWorld(t, w, WithMaxReceipts(50), WithRefusals(func(r string) { reasons = append(reasons, r) }))
	for i := range 200 {
		r := mustSign(t, jobReceipt(uint64(10+i), w.c, int64(i), int64(i+1), t0), w.m)
		if _, err := l.Add(r); !errors.Is(err, ErrUnknownTerm) {
			t.Fatalf("forged receipt %d: %v", i, err)
		}
	}
	if n := l.Store().Len(); n != 0 {
		t.Fatalf("stored %d forged receipts", n)
	}
	if len(reasons) != 200 || reasons[0] != "unknown_term" {
		t.Fatalf("refusals counted: %d, first %q", len(reasons), reasons[0])
	}
	if _, err := l.Add(mustSign(t, jobReceipt(2, w.c, 0, 10, t0), w.b)); err != nil {
		t.Fatalf("genuine receipt after the flood: %v", err)
	}
}

// A receipt of the next term, heard before the election records the
// term, is held in memory and kept only if that term's coordinator
// signed it; the forger's share of what is held is bounded.
func TestAttackHeldReceiptsOfNextTerm(t *testing.T) {
	w := newWorld(t)
	l := recordWorld(t, w)
	genuine := mustSign(t, jobReceipt(3, w.c, 0, 10, t0), w.d)
	if _, err := l.Add(genuine); !errors.Is(err, ErrTermPending) {
		t.Fatalf("next term: %v", err)
	}
	var full error
	for i := range maxPendingPerSigner + 10 {
		_, err := l.Add(mustSign(t, jobReceipt(3, w.c, int64(10+i), int64(11+i), t0), w.m))
		if errors.Is(err, ErrPendingFull) {
			full = err
			break
		}
	}
	if full == nil || l.Pending() != maxPendingPerSigner+1 {
		t.Fatalf("one signer filled the held receipts: %d held, %v", l.Pending(), full)
	}
	if err := l.RecordTerm(TermRecord{Term: 3, Coordinator: w.d.id, AcceptedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if got := l.Store().Receipts(); len(got) != 1 || got[0].Hash() != genuine.Hash() || l.Pending() != 0 {
		t.Fatalf("after term 3 was recorded: %d stored, %d held", len(got), l.Pending())
	}
}

// The coordinator of one term, gone bad, signs a flood of valid receipts:
// it fills only its share, and a genuine receipt of another coordinator
// is still kept.
func TestAttackSignerFloodLeavesRoomForOthers(t *testing.T) {
	w := newWorld(t)
	l := recordWorld(t, w, WithMaxReceipts(200))
	var full error
	for i := range 200 {
		r := mustSign(t, jobReceipt(1, w.c, int64(i), int64(i+1), t0.Add(time.Duration(i)*time.Second)), w.a)
		if _, err := l.Add(r); err != nil {
			full = err
			break
		}
	}
	if !errors.Is(full, ErrSignerFull) || l.Store().SignerLen(w.a.id) != 200/DefaultSignerShare {
		t.Fatalf("flood: %v, %d kept of signer a", full, l.Store().SignerLen(w.a.id))
	}
	if added, err := l.Add(mustSign(t, jobReceipt(2, w.d, 0, 10, t0), w.b)); !added || err != nil {
		t.Fatalf("genuine receipt of another signer: %v %v", added, err)
	}
}

// A store written before terms were checked holds forged receipts whose
// periods end far in the future: Resume ignores them, so a present node
// is still credited by the next coordinator.
func TestAttackResumeIgnoresForgedReceipts(t *testing.T) {
	w := newWorld(t)
	now := t0.Add(48 * time.Hour)
	future := now.Add(100 * 24 * time.Hour)
	far := func(term uint64, signer ident) Receipt {
		r := Receipt{Swarm: "lab", Term: term, Peer: w.c.id, JobID: "job-1", FromStep: 0, ToStep: 1 << 30,
			PeriodStart: future.Add(-time.Hour), PeriodEnd: future, PresenceS: 1, IssuedAt: future}
		return mustSign(t, r, signer)
	}
	tampered := mustSign(t, jobReceipt(1, w.c, 0, 10, t0), w.a)
	tampered.PeriodEnd = future
	tampered.IssuedAt = future
	stored := []Receipt{
		far(1, w.m), // signed by someone who was not term 1's coordinator
		far(9, w.m), // a term never accepted
		far(2, w.b), // the real coordinator, but a period ending in the future
		tampered,    // a genuine receipt doctored after signing
		mustSign(t, jobReceipt(1, w.d, 0, 10, t0), w.a), // genuine: used
	}
	is, _ := NewIssuer(w.b.key, "lab", 10*time.Second)
	if n := is.Resume(stored, w.hist, now); n != 1 {
		t.Fatalf("resume used %d receipts, want only the genuine one", n)
	}
	is.Seen(w.c.id, now.Add(-20*time.Second))
	is.Seen(w.c.id, now.Add(-10*time.Second))
	is.Work(w.c.id, "job-1", 0, 10, 5, 100)
	rs, err := is.Issue(2, now)
	if err != nil {
		t.Fatal(err)
	}
	rep := Verify("lab", rs, w.hist)
	c, ok := rep.Entry(w.c.id)
	if !ok || c.PresenceS != 10 || c.Tokens != 100 {
		t.Fatalf("present node's credit after a forged store: %+v (%v)", c, rep.Rejected)
	}
}

// A researcher reports 2^40 tokens for its stage three times: the issuer
// caps each report by the compute claimed and, given the job's signed
// spec, by its tokens per step and its last step.
func TestAttackSelfReportedWorkIsCapped(t *testing.T) {
	w := newWorld(t)
	is, _ := NewIssuer(w.a.key, "lab", 10*time.Second)
	is.Seen(w.c.id, t0)
	for i := range 3 {
		is.Work(w.c.id, "job-1", int64(i*10), int64(i*10+10), 60, MaxTokens)
	}
	rs, err := is.Issue(1, t0.Add(5*time.Minute))
	if err != nil || len(rs) != 1 {
		t.Fatalf("%v %d", err, len(rs))
	}
	if max := int64(3 * 60 * MaxTokensPerComputeS); rs[0].Tokens > max {
		t.Fatalf("credited %d tokens for 180 s of compute, over %d", rs[0].Tokens, max)
	}

	is.LimitJob("job-2", JobLimit{TokensPerStep: 4096, LastStep: 100})
	for range 3 {
		is.Work(w.c.id, "job-2", 1, 1<<30, 60, MaxTokens)
	}
	rs, err = is.Issue(1, t0.Add(10*time.Minute))
	if err != nil || len(rs) != 1 {
		t.Fatalf("%v %d", err, len(rs))
	}
	if rs[0].ToStep != 101 || rs[0].Tokens > 100*4096 {
		t.Fatalf("spec-bounded report credited steps [%d, %d) and %d tokens", rs[0].FromStep, rs[0].ToStep, rs[0].Tokens)
	}
	if p := Points(rs[0]); p > 100*4096/TokensPerPoint+5+1 {
		t.Fatalf("%.0f points for a 100-step job", p)
	}
}

func TestLedgerDirIsPrivate(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(Dir(data), 0o755); err != nil { // as an older version made it
		t.Fatal(err)
	}
	l, err := Open(data, "lab")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, p := range []string{Dir(data), filepath.Join(Dir(data), ReceiptsFile), filepath.Join(Dir(data), TermsFile)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s has mode %04o", p, fi.Mode().Perm())
		}
	}
}
