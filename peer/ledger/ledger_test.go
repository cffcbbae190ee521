package ledger

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

type ident struct {
	key crypto.PrivKey
	id  string
}

func newIdent(t testing.TB) ident {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return ident{k, id.String()}
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// world is a swarm "lab" whose term 1 was coordinated by a and term 2 by
// b; c and d are stage nodes, m a would-be forger.
type world struct {
	a, b, c, d, m ident
	hist          *History
}

func newWorld(t testing.TB) world {
	w := world{a: newIdent(t), b: newIdent(t), c: newIdent(t), d: newIdent(t), m: newIdent(t)}
	var err error
	w.hist, err = NewHistory("lab",
		TermRecord{Swarm: "lab", Term: 1, Coordinator: w.a.id, TEE: "sim", Insecure: true, AcceptedAt: t0},
		TermRecord{Swarm: "lab", Term: 2, Coordinator: w.b.id, TEE: "sev-snp", AcceptedAt: t0.Add(time.Hour)},
	)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func jobReceipt(term uint64, p ident, from, to int64, start time.Time) Receipt {
	return Receipt{
		Swarm: "lab", Term: term, Peer: p.id, JobID: "job-1",
		FromStep: from, ToStep: to,
		PeriodStart: start, PeriodEnd: start.Add(5 * time.Minute),
		PresenceS: 300, ComputeS: 240, Tokens: 50_000,
		IssuedAt: start.Add(5*time.Minute + time.Second),
	}
}

func mustSign(t testing.TB, r Receipt, k ident) Receipt {
	t.Helper()
	s, err := Sign(r, k.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPointsFormula(t *testing.T) {
	r := Receipt{PresenceS: 3600, ComputeS: 120, Tokens: 25_000}
	if got, want := Points(r), 1.0+2.0+2.5; got != want {
		t.Fatalf("Points = %v, want %v", got, want)
	}
}

func TestSignEncodeDecodeVerify(t *testing.T) {
	w := newWorld(t)
	r1 := mustSign(t, jobReceipt(1, w.c, 0, 100, t0), w.a)
	r2 := mustSign(t, jobReceipt(2, w.c, 100, 200, t0.Add(time.Hour)), w.b)
	r3 := mustSign(t, jobReceipt(2, w.d, 0, 200, t0.Add(time.Hour)), w.b)
	var decoded []Receipt
	for _, r := range []Receipt{r1, r2, r3} {
		b, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeReceipt(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if back.Hash() != r.Hash() || !bytes.Equal(back.Sig, r.Sig) {
			t.Fatalf("round trip changed the receipt:\n%+v\n%+v", r, back)
		}
		decoded = append(decoded, back)
	}
	rep := Verify("lab", decoded, w.hist)
	if len(rep.Rejected) != 0 {
		t.Fatalf("rejected: %v", rep.Rejected)
	}
	c, ok := rep.Entry(w.c.id)
	if !ok || c.Receipts != 2 || c.Tokens != 100_000 || c.ComputeS != 480 || c.PresenceS != 600 {
		t.Fatalf("c's total: %+v", c)
	}
	if want := 2 * (300.0/3600 + 240.0/60 + 5); math.Abs(c.Points-want) > 1e-9 {
		t.Fatalf("c's points %v, want %v", c.Points, want)
	}
	if rep.Totals[0].PeerID != w.c.id && rep.Totals[0].Points < rep.Totals[1].Points {
		t.Fatalf("totals not sorted: %+v", rep.Totals)
	}
	if !reflect.DeepEqual(rep.InsecureTerms, []uint64{1}) {
		t.Fatalf("insecure terms %v, want [1]", rep.InsecureTerms)
	}
}

func TestVerifyRejects(t *testing.T) {
	w := newWorld(t)
	good := mustSign(t, jobReceipt(1, w.c, 0, 100, t0), w.a)
	tamper := func(f func(*Receipt)) Receipt {
		r := good
		r.Sig = bytes.Clone(good.Sig)
		f(&r)
		return r
	}
	cases := []struct {
		name string
		r    Receipt
		want error
	}{
		{"more tokens", tamper(func(r *Receipt) { r.Tokens *= 10 }), ErrBadSignature},
		{"more compute", tamper(func(r *Receipt) { r.ComputeS = 299 }), ErrBadSignature},
		{"other peer", tamper(func(r *Receipt) { r.Peer = w.d.id }), ErrBadSignature},
		{"other term", tamper(func(r *Receipt) { r.Term = 2 }), ErrBadSignature},
		{"other steps", tamper(func(r *Receipt) { r.ToStep = 101 }), ErrBadSignature},
		{"later issue", tamper(func(r *Receipt) { r.IssuedAt = r.IssuedAt.Add(time.Nanosecond) }), ErrBadSignature},
		{"flipped signature bit", tamper(func(r *Receipt) { r.Sig[3] ^= 1 }), ErrBadSignature},
		{"no signature", tamper(func(r *Receipt) { r.Sig = nil }), ErrBadSignature},
		// m signs as itself for a term it never held.
		{"forged by a non-coordinator", mustSign(t, jobReceipt(1, w.m, 0, 100, t0), w.m), ErrNotCoordinator},
		// m signs, then names the real coordinator: the key does not match.
		{"forged under the coordinator's name", func() Receipt {
			r := mustSign(t, jobReceipt(1, w.m, 0, 100, t0), w.m)
			r.Coordinator = w.a.id
			return r
		}(), ErrBadSignature},
		// b was coordinator, but of term 2, not 1.
		{"coordinator of another term", mustSign(t, jobReceipt(1, w.d, 0, 100, t0), w.b), ErrNotCoordinator},
		{"unknown term", mustSign(t, jobReceipt(9, w.c, 500, 600, t0), w.b), ErrUnknownTerm},
		{"other swarm", func() Receipt {
			r := jobReceipt(1, w.c, 0, 100, t0)
			r.Swarm = "elsewhere"
			return mustSign(t, r, w.a)
		}(), ErrOtherSwarm},
		{"malformed", tamper(func(r *Receipt) { r.ComputeS = -1 }), ErrMalformed},
		{"presence beyond the period", tamper(func(r *Receipt) { r.PresenceS = 3000 }), ErrMalformed},
		{"duplicate", good, ErrDuplicate},
		{"same steps again", mustSign(t, jobReceipt(1, w.c, 50, 150, t0.Add(10*time.Minute)), w.a), ErrOverlap},
		{"same presence again", func() Receipt {
			r := jobReceipt(1, w.c, 0, 100, t0.Add(time.Minute))
			r.JobID = "job-2"
			return mustSign(t, r, w.a)
		}(), ErrOverlap},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := Verify("lab", []Receipt{good, tc.r}, w.hist)
			if rep.Accepted != 1 || len(rep.Rejected) != 1 {
				t.Fatalf("accepted %d, rejected %v", rep.Accepted, rep.Rejected)
			}
			if err := rep.Rejected[0].Err; !errors.Is(err, tc.want) {
				t.Fatalf("rejected for %v, want %v", err, tc.want)
			}
			if e, _ := rep.Entry(w.c.id); e.Points != Points(good) {
				t.Fatalf("c has %v points, want exactly the good receipt's %v", e.Points, Points(good))
			}
		})
	}
}

func TestVerifyIsOrderIndependent(t *testing.T) {
	w := newWorld(t)
	var rs []Receipt
	for i := range 20 {
		start := t0.Add(time.Duration(i) * 4 * time.Minute) // 5-minute periods every 4: presence overlaps
		rs = append(rs, mustSign(t, jobReceipt(1, w.c, int64(i*50), int64(i*50+70), start), w.a))
		rs = append(rs, mustSign(t, jobReceipt(2, w.d, int64(i*100), int64(i*100+100), start), w.b))
	}
	rs = append(rs, rs[3], rs[7])
	want := Verify("lab", rs, w.hist)
	if len(want.Rejected) == 0 || want.Accepted == 0 {
		t.Fatalf("want some of each: accepted %d rejected %d", want.Accepted, len(want.Rejected))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
		got := Verify("lab", rs, w.hist)
		if !reflect.DeepEqual(got.Totals, want.Totals) || len(got.Rejected) != len(want.Rejected) {
			t.Fatalf("order changed the result:\n%+v\n%+v", got.Totals, want.Totals)
		}
	}
}

func TestStore(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	path := filepath.Join(dir, ReceiptsFile)
	s, err := OpenStore(path, "lab", WithMaxReceipts(3), WithMaxPerSigner(3), WithTermCheck(w.hist))
	if err != nil {
		t.Fatal(err)
	}
	r1 := mustSign(t, jobReceipt(1, w.c, 0, 100, t0), w.a)
	if added, err := s.Add(r1); !added || err != nil {
		t.Fatalf("add: %v %v", added, err)
	}
	if added, err := s.Add(r1); added || err != nil {
		t.Fatalf("add again: %v %v, want a quiet no", added, err)
	}
	forged := r1
	forged.Tokens++
	if _, err := s.Add(forged); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered: %v", err)
	}
	if _, err := s.Add(mustSign(t, jobReceipt(1, w.d, 0, 100, t0), w.b)); !errors.Is(err, ErrNotCoordinator) {
		t.Fatalf("wrong coordinator: %v", err)
	}
	if _, err := s.Add(mustSign(t, jobReceipt(40, w.d, 0, 100, t0), w.b)); !errors.Is(err, ErrUnknownTerm) {
		t.Fatalf("far future term: %v", err)
	}
	if added, err := s.Add(mustSign(t, jobReceipt(3, w.d, 0, 100, t0), w.m)); added || !errors.Is(err, ErrUnknownTerm) {
		t.Fatalf("a receipt of a term not known is refused, not stored: %v %v", added, err)
	}
	if added, err := s.Add(mustSign(t, jobReceipt(1, w.d, 0, 100, t0), w.a)); !added || err != nil {
		t.Fatalf("add: %v %v", added, err)
	}
	b, _ := mustSign(t, jobReceipt(2, w.c, 100, 200, t0.Add(time.Hour)), w.b).Encode()
	if added, err := s.AddEncoded(b); !added || err != nil {
		t.Fatalf("add encoded: %v %v", added, err)
	}
	if _, err := s.Add(mustSign(t, jobReceipt(2, w.d, 100, 200, t0.Add(time.Hour)), w.b)); !errors.Is(err, ErrStoreFull) {
		t.Fatalf("over the bound: %v", err)
	}
	s.Close()

	// A torn last line (a crash mid-write) and a junk line are skipped.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("not json\n" + strings.Repeat("x", 2*MaxReceiptBytes) + "\n{\"v\":1,\"swarm\":\"la")
	f.Close()
	s, err = OpenStore(path, "lab")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Len() != 3 || s.Skipped() != 3 {
		t.Fatalf("reopened: %d receipts, %d skipped; want 3 and 3", s.Len(), s.Skipped())
	}
	rep := Verify("lab", s.Receipts(), w.hist)
	if rep.Accepted != 3 || len(rep.Rejected) != 0 {
		t.Fatalf("verify after reopen: %+v", rep)
	}
	if _, err := s.Add(mustSign(t, func() Receipt { r := jobReceipt(1, w.c, 0, 100, t0); r.Swarm = "x"; return r }(), w.a)); !errors.Is(err, ErrOtherSwarm) {
		t.Fatalf("other swarm: %v", err)
	}
}

func TestHistoryFile(t *testing.T) {
	w := newWorld(t)
	path := filepath.Join(t.TempDir(), TermsFile)
	h, err := OpenHistory(path, "lab")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range w.hist.Records() {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
		if err := h.Record(r); err != nil {
			t.Fatalf("recording the same term twice: %v", err)
		}
	}
	if err := h.Record(TermRecord{Swarm: "lab", Term: 2, Coordinator: w.m.id}); !errors.Is(err, ErrTermConflict) {
		t.Fatalf("conflict: %v", err)
	}
	if err := h.Record(TermRecord{Swarm: "other", Term: 3, Coordinator: w.m.id}); !errors.Is(err, ErrOtherSwarm) {
		t.Fatalf("other swarm: %v", err)
	}
	h.Close()
	back, err := LoadHistory(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := back.CoordinatorOf(1); !ok || c != w.a.id {
		t.Fatalf("term 1: %q %v", c, ok)
	}
	if _, ok := back.CoordinatorOf(2); ok {
		t.Fatal("a term with two coordinators on file answers no one")
	}
	if back.Swarm() != "lab" || back.Newest() != 2 {
		t.Fatalf("swarm %q newest %d", back.Swarm(), back.Newest())
	}
	// With term 2 disowned, b's receipts no longer count.
	rep := Verify("lab", []Receipt{mustSign(t, jobReceipt(2, w.c, 0, 10, t0), w.b)}, back)
	if len(rep.Rejected) != 1 || !errors.Is(rep.Rejected[0].Err, ErrUnknownTerm) {
		t.Fatalf("%+v", rep.Rejected)
	}
}

func TestIssuer(t *testing.T) {
	w := newWorld(t)
	is, err := NewIssuer(w.a.key, "lab", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// c heartbeats every 5 s for a minute, then is silent 40 s (not
	// present), then heartbeats again; d is only present.
	for s := 0; s <= 60; s += 5 {
		is.Seen(w.c.id, t0.Add(time.Duration(s)*time.Second))
		is.Seen(w.d.id, t0.Add(time.Duration(s)*time.Second))
	}
	is.Seen(w.c.id, t0.Add(100*time.Second))
	is.Seen(w.c.id, t0.Add(105*time.Second))
	is.Work(w.c.id, "job-1", 0, 50, 90, 40_000)
	is.Work(w.c.id, "job-1", 50, 80, 20, 10_000)
	first, err := is.Issue(1, t0.Add(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 2 {
		t.Fatalf("want one receipt each for c and d, got %d: %+v", len(first), first)
	}
	rep := Verify("lab", first, w.hist)
	c, _ := rep.Entry(w.c.id)
	d, _ := rep.Entry(w.d.id)
	if len(rep.Rejected) != 0 || c.PresenceS != 65 || c.ComputeS != 110 || c.Tokens != 50_000 || d.PresenceS != 60 || d.ComputeS != 0 {
		t.Fatalf("first interval: c %+v d %+v rejected %v", c, d, rep.Rejected)
	}

	// Progress that repeats steps already credited is cut to the new part.
	is.Work(w.c.id, "job-1", 60, 100, 40, 20_000)
	is.Seen(w.c.id, t0.Add(125*time.Second)) // 20 s after the last sighting: a gap, not presence
	second, err := is.Issue(1, t0.Add(3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != 1 || second[0].FromStep != 80 || second[0].ToStep != 100 || second[0].Tokens != 10_000 || second[0].ComputeS != 20 {
		t.Fatalf("second interval: %+v", second)
	}

	// A new coordinator (term 2) resumes from the receipts and does not
	// credit the same steps or time again even if told so.
	is2, _ := NewIssuer(w.b.key, "lab", 10*time.Second)
	all := append(first, second...)
	if n := is2.Resume(all, w.hist, t0.Add(4*time.Minute)); n != len(all) {
		t.Fatalf("resume used %d of %d genuine receipts", n, len(all))
	}
	is2.Work(w.c.id, "job-1", 90, 130, 40, 40_000)
	is2.Seen(w.c.id, t0.Add(175*time.Second)) // the last period ended at 180 s: only 3 s count
	is2.Seen(w.c.id, t0.Add(183*time.Second))
	third, err := is2.Issue(2, t0.Add(4*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, third...)
	rep = Verify("lab", all, w.hist)
	if len(rep.Rejected) != 0 {
		t.Fatalf("rejected: %v", rep.Rejected)
	}
	c, _ = rep.Entry(w.c.id)
	if c.Tokens != 50_000+10_000+30_000 || c.PresenceS != 65+0+3 {
		t.Fatalf("after the new term: %+v", c)
	}
}

func TestHandlerAndFetch(t *testing.T) {
	w := newWorld(t)
	l, err := Open(t.TempDir(), "lab")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, r := range w.hist.Records() {
		if err := l.RecordTerm(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []Receipt{
		mustSign(t, jobReceipt(1, w.c, 0, 100, t0), w.a),
		mustSign(t, jobReceipt(2, w.d, 0, 100, t0), w.b),
	} {
		if _, err := l.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	// A receipt of a term not yet recorded is held, not stored.
	if _, err := l.Add(mustSign(t, jobReceipt(3, w.d, 100, 200, t0), w.m)); !errors.Is(err, ErrTermPending) {
		t.Fatalf("next term: %v", err)
	}
	if n := len(l.Leaderboard()); n != 2 {
		t.Fatalf("leaderboard of %d", n)
	}
	srv := httptest.NewServer(l.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	rs, hist, err := Fetch(context.Background(), addr, "lab", 1000)
	if err != nil {
		t.Fatal(err)
	}
	got := Verify("lab", rs, hist)
	if !reflect.DeepEqual(got.Totals, l.Report().Totals) || len(got.Rejected) != 0 || len(rs) != 2 {
		t.Fatalf("fetched and verified elsewhere: %+v, node says %+v", got, l.Report())
	}
}

func TestCheckIncoming(t *testing.T) {
	w := newWorld(t)
	b, _ := mustSign(t, jobReceipt(1, w.c, 0, 100, t0), w.a).Encode()
	if _, err := CheckIncoming(b, "lab", w.a.id, w.hist); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckIncoming(b, "lab", w.c.id, w.hist); !errors.Is(err, ErrNotCoordinator) {
		t.Fatalf("relayed by someone else: %v", err)
	}
	if _, err := CheckIncoming(b, "other", w.a.id, w.hist); !errors.Is(err, ErrOtherSwarm) {
		t.Fatalf("other swarm: %v", err)
	}
	b2, _ := mustSign(t, jobReceipt(2, w.c, 0, 100, t0), w.a).Encode()
	if _, err := CheckIncoming(b2, "lab", w.a.id, w.hist); !errors.Is(err, ErrNotCoordinator) {
		t.Fatalf("term 2 belongs to b: %v", err)
	}
	if _, err := CheckIncoming(append(b, ` {}`...), "lab", w.a.id, w.hist); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing data: %v", err)
	}
	if _, err := CheckIncoming(bytes.Replace(b, []byte(`"v":1`), []byte(`"v":1,"bonus":5`), 1), "lab", w.a.id, w.hist); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unknown field: %v", err)
	}
}
