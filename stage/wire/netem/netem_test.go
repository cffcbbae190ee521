//go:build linux

package netem

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

// TestNetemPeerChild is not a test: Measure re-runs the test binary with
// -test.run for this function to start a sender or receiver inside a
// namespace.
func TestNetemPeerChild(t *testing.T) {
	if os.Getenv(EnvPeer) == "" {
		t.Skip("runs only as a child of Measure")
	}
	if err := PeerMain(context.Background(), os.Stdout); err != nil {
		t.Fatal(err)
	}
}

func self(t testing.TB) []string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, "-test.run=^TestNetemPeerChild$"}
}

func setup(t testing.TB, cfg Config) *Link {
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Setup(ctx, cfg)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		for _, ns := range l.NS {
			if nsExists(context.Background(), ns) {
				t.Errorf("namespace %s left behind", ns)
			}
		}
	})
	return l
}

// TestLinkEnforcesTheRate streams bf16 activations across a slow link and
// checks that what arrives is bounded by the configured rate (so the
// shaping is real) and not far below it (so the path works).
func TestLinkEnforcesTheRate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds namespaces and streams for seconds")
	}
	l := setup(t, Config{RateMbit: 20, Delay: 10 * time.Millisecond})
	t.Logf("emulation: %s", l.Mode)
	res, err := l.Measure(context.Background(), self(t), Run{Codec: codec.BF16, Dim: 128, Tokens: 256, Duration: 2 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	mbit := res.TokensPerSec * res.BytesPerToken * 8 / 1e6
	t.Logf("%.0f tokens/s at %.1f B/token = %.1f Mbit/s of stream bytes on a 20 Mbit/s link (path %s)", res.TokensPerSec, res.BytesPerToken, mbit, res.Path)
	// TCP/IP headers ride on the link too, so the stream sees less than
	// the rate; a working path should still see more than half of it.
	if mbit > 20*1.05 || mbit < 10 {
		t.Fatalf("%.1f Mbit/s of stream bytes across a 20 Mbit/s link", mbit)
	}
}

// BenchmarkHomeLinkTokensPerSec is the Wire issue's figure: tokens per
// second across one boundary at 80 Mbit/s and 40 ms RTT, subspace vs bf16,
// at the demo model's d_model (128, k 32).
func BenchmarkHomeLinkTokensPerSec(b *testing.B) {
	l := setup(b, Config{})
	for b.Loop() {
	}
	for _, id := range []codec.ID{codec.BF16, codec.SubspaceBF16} {
		res, err := l.Measure(context.Background(), self(b), Run{Codec: id, Dim: 128, Rank: 32, Vocab: 256, Seed: 7, Tokens: 512, Duration: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.TokensPerSec, id.String()+"-tokens/s")
		b.Logf("%s (%s): %.0f tokens/s, %.1f B/token", id, l.Mode, res.TokensPerSec, res.BytesPerToken)
	}
}
