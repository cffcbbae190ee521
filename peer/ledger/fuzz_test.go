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
