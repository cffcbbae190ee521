package ledger

import (
	"testing"
	"time"
)

// BenchmarkVerify measures a full verification of 10,000 receipts, first
// with every signature checked, then as a node's Verifier re-verifies a
// store whose signatures it has seen.
func BenchmarkVerify(b *testing.B) {
	w := newWorld(b)
	rs := make([]Receipt, 10_000)
	for i := range rs {
		rs[i] = mustSign(b, jobReceipt(1, w.c, int64(i*10), int64(i*10+10), t0.Add(time.Duration(i)*5*time.Minute)), w.a)
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			if rep := Verify("lab", rs, w.hist); rep.Accepted != len(rs) {
				b.Fatal(rep.Rejected[0].Err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(rs)), "ns/receipt")
	})
	b.Run("cached", func(b *testing.B) {
		v := NewVerifier()
		v.Verify("lab", rs, w.hist)
		for b.Loop() {
			v.Verify("lab", rs, w.hist)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(rs)), "ns/receipt")
	})
}
