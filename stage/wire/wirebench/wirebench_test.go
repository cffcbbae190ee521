package wirebench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

func TestSubspaceSendsUnderOnePointFivePercentOfBF16OnTheStream(t *testing.T) {
	rows, err := BytesPerToken(512)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3*len(Codecs) {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		t.Logf("%-14s d=%-5d k=%-4d fwd %8.2f B/token (%6.2f%% of bf16)  bwd %8.2f B/token (%6.2f%%)",
			r.Codec, r.Dim, r.Rank, r.Forward, 100*r.Forward/r.BF16Forward, r.Backward, 100*r.Backward/r.BF16Backward)
		if r.Forward < r.PayloadFwd || r.Backward < r.PayloadBwd {
			t.Fatalf("%s d=%d: stream bytes below payload bytes", r.Codec, r.Dim)
		}
		if r.Codec == codec.SubspaceBF16 && r.Dim == 4096 {
			if r.Forward/r.BF16Forward > 0.015 || r.Backward/r.BF16Backward > 0.015 {
				t.Fatalf("subspace at d 4096, k 40 sends %.3f%% / %.3f%% of bf16", 100*r.Forward/r.BF16Forward, 100*r.Backward/r.BF16Backward)
			}
		}
	}
}

func TestCodecOverheadMeasuresTheDemoStage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo stage")
	}
	rows, err := CodecOverhead(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		t.Logf("%-14s codec %8.0f ns/token, stage %8.0f ns/token: %.4f", r.Codec, r.CodecNsPerToken, r.StageNsPerToken, r.Fraction)
		if !(r.Fraction > 0) || r.StageNsPerToken <= 0 {
			t.Fatalf("bad row %+v", r)
		}
	}
}

// BenchmarkBytesPerToken reports the table as metrics (b.N is ignored).
func BenchmarkBytesPerToken(b *testing.B) {
	for b.Loop() {
	}
	rows, err := BytesPerToken(512)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range rows {
		if r.Codec == codec.SubspaceBF16 || r.Codec == codec.BF16 || r.Codec == codec.Int8Block {
			b.ReportMetric(r.Forward, fmt.Sprintf("%s-d%d-fwd-B/token", r.Codec, r.Dim))
		}
	}
}

// BenchmarkCodecOverhead reports each codec's encode+decode time per token
// as a fraction of the demo middle stage's forward+backward per token.
func BenchmarkCodecOverhead(b *testing.B) {
	for b.Loop() {
	}
	rows, err := CodecOverhead(context.Background(), 500*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range rows {
		b.ReportMetric(r.Fraction, r.Codec.String()+"-fraction")
	}
	b.ReportMetric(rows[0].StageNsPerToken, "stage-ns/token")
}
