package wire

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

func TestFrameWireBytesAtRecordBoundaries(t *testing.T) {
	for _, tc := range []struct{ payload, records int }{
		{0, 1}, {firstChunk, 1}, {firstChunk + 1, 2},
		{firstChunk + MaxRecordPlaintext, 2}, {firstChunk + MaxRecordPlaintext + 1, 3},
	} {
		if got, want := FrameWireBytes(tc.payload), tc.payload+HeaderSize+tc.records*(recordPrefix+TagSize); got != want {
			t.Fatalf("FrameWireBytes(%d) = %d, want %d (%d records)", tc.payload, got, want, tc.records)
		}
	}
}

// BenchmarkGoodput reports the stage stream's goodput next to raw TCP on
// loopback (b.N is ignored: each figure runs for a fixed time).
func BenchmarkGoodput(b *testing.B) {
	for b.Loop() {
	}
	for _, sec := range []string{"noise", "tls"} {
		r, err := MeasureGoodput(context.Background(), GoodputOptions{Duration: 500 * time.Millisecond, Security: sec})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.StreamMBps, sec+"-stream-MB/s")
		b.ReportMetric(r.LinkFP32MBps, sec+"-fp32link-MB/s")
		b.ReportMetric(r.TCPMBps, sec+"-run-tcp-MB/s")
		b.ReportMetric(r.StreamMBps/r.TCPMBps, sec+"-stream/tcp")
		b.Logf("libp2p security under the stage stream: %s", r.Security)
	}
}

// BenchmarkRecordLayer is the stage layer's own cost with no network:
// sealing a 4 MiB frame into records and opening it again (one core).
func BenchmarkRecordLayer(b *testing.B) {
	send, recv := sessionPair(b)
	payload := make([]byte, 4<<20)
	var buf bytes.Buffer
	w := newRecordWriter(send, &buf, nil)
	r := newRecordReader(recv, &buf, nil)
	into := make([]byte, len(payload))
	h := header{Version: ProtocolVersion, Kind: KindForward, Codec: codec.FP32, Rows: 1, Cols: 1, Job: testJob, Length: uint64(len(payload))}
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		hh := h
		if err := w.writeFrame(&hh, payload); err != nil {
			b.Fatal(err)
		}
		if _, _, err := r.readFrame(func(*header) error { return nil }, func(int) ([]byte, error) { return into, nil }); err != nil {
			b.Fatal(err)
		}
	}
}
