package ledger

import (
	"bytes"
	"testing"
	"time"
)

func FuzzDecodeReceipt(f *testing.F) {
	w := newWorld(f)
	b, _ := mustSign(f, jobReceipt(1, w.c, 0, 100, t0), w.a).Encode()
	f.Add(b)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"v":1,"swarm":"lab","term":1}`))
	f.Add(bytes.Repeat([]byte(`[`), 5000))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReceipt(b)
		if err != nil {
			return
		}
		// Whatever decodes is in range and survives a round trip.
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded an invalid receipt: %v", err)
		}
		enc, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeReceipt(enc)
		if err != nil || back.Hash() != r.Hash() {
			t.Fatalf("round trip: %v", err)
		}
		_ = r.CheckSignature()
	})
}

func FuzzDecodeTermRecord(f *testing.F) {
	w := newWorld(f)
	for _, r := range w.hist.Records() {
		b, _ := encodeLine(r)
		f.Add(b)
	}
	f.Add([]byte(`{"swarm":"lab","term":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeTermRecord(b)
		if err != nil {
			return
		}
		if err := r.validate(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzReadReceipts feeds whole files (or API bodies): the reader never
// keeps more than its bounds and never fails on a bad line.
func FuzzReadReceipts(f *testing.F) {
	w := newWorld(f)
	var file []byte
	for i := range 3 {
		b, _ := mustSign(f, jobReceipt(1, w.c, int64(i*10), int64(i*10+10), t0.Add(time.Duration(i)*time.Hour)), w.a).Encode()
		file = append(append(file, b...), '\n')
	}
	f.Add(file)
	f.Add(append(file[:len(file)-40:len(file)-40], "\n\n\r\n"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, _, err := ReadReceipts(bytes.NewReader(b), 5)
		if len(rs) > 5 {
			t.Fatalf("kept %d receipts over a bound of 5", len(rs))
		}
		if err == nil {
			Verify("lab", rs, w.hist)
		}
		_, _ = ReadHistory(bytes.NewReader(b), "")
	})
}

// FuzzLedgerIntake feeds gossip-like messages (one per line) to a ledger
// with terms recorded, then has a new coordinator resume from what was
// stored. Whatever arrives: only receipts of known terms signed by their
// coordinator are stored, no signer exceeds its share, and resuming never
// takes credit from a present peer, since no fuzzed receipt can carry a
// good signature of a coordinator with a period ending after now.
func FuzzLedgerIntake(f *testing.F) {
	w := newWorld(f)
	var seed []byte
	for i, r := range []Receipt{
		mustSign(f, jobReceipt(1, w.c, 0, 10, t0), w.a),
		mustSign(f, jobReceipt(2, w.d, 0, 10, t0.Add(time.Hour)), w.b),
		mustSign(f, jobReceipt(3, w.d, 10, 20, t0.Add(2*time.Hour)), w.m),
		mustSign(f, jobReceipt(1, w.c, 0, 10, t0), w.m),
	} {
		b, _ := r.Encode()
		if i == 3 {
			b = bytes.Replace(b, []byte(`"tokens":50000`), []byte(`"tokens":50001`), 1)
		}
		seed = append(append(seed, b...), '\n')
	}
	f.Add(seed)
	f.Add([]byte("{}\n\n{\"v\":1}\n"))
	now := t0.Add(72 * time.Hour)
	f.Fuzz(func(t *testing.T, b []byte) {
		// In memory, as Open builds it from files.
		hist, _ := NewHistory("lab")
		store, err := OpenStore("", "lab", WithMaxReceipts(8), WithTermCheck(hist))
		if err != nil {
			t.Fatal(err)
		}
		l := newLedger("lab", store, hist)
		for _, r := range w.hist.Records() {
			if err := l.RecordTerm(r); err != nil {
				t.Fatal(err)
			}
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			r, err := CheckIncoming(line, "lab", "", l.History())
			if err != nil {
				r, err = DecodeReceipt(line)
			}
			if err == nil {
				_, _ = l.Add(r)
			}
		}
		_ = l.RecordTerm(TermRecord{Term: 3, Coordinator: w.m.id, AcceptedAt: t0})
		stored := l.Store().Receipts()
		for _, r := range stored {
			if c, ok := l.History().CoordinatorOf(r.Term); !ok || c != r.Coordinator || r.CheckSignature() != nil {
				t.Fatalf("stored a receipt that does not verify: term %d by %s", r.Term, r.Coordinator)
			}
		}
		for _, id := range []ident{w.a, w.b, w.m} {
			if n := l.Store().SignerLen(id.id); n > 2 {
				t.Fatalf("signer kept %d receipts, over its share of 2", n)
			}
		}
		is, _ := NewIssuer(w.b.key, "lab", 10*time.Second)
		if n := is.Resume(stored, l.History(), now); n > len(stored) {
			t.Fatalf("resume used %d of %d", n, len(stored))
		}
		is.Seen(w.c.id, now.Add(-20*time.Second))
		is.Seen(w.c.id, now.Add(-10*time.Second))
		rs, err := is.Issue(2, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || rs[0].PresenceS != 10 {
			t.Fatalf("a present peer's credit after resume: %+v", rs)
		}
		l.Report()
	})
}
