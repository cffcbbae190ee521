package wire

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"

	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

var testJob = JobID{0xb0, 0x0b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}

// newHost is a real libp2p host on a loopback TCP port.
func newHost(t testing.TB, opts ...libp2p.Option) host.Host {
	t.Helper()
	base := []libp2p.Option{
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.DisableMetrics(),
	}
	h, err := libp2p.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func connect(t testing.TB, a, b host.Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func newService(t testing.TB, h host.Host, auth Authorizer, opts ...Option) *Service {
	t.Helper()
	s, err := NewService(h, auth, append([]Option{WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustCodec(t testing.TB, id codec.ID, d int, b *subspace.Basis) codec.Codec {
	t.Helper()
	c, err := codec.New(id, codec.Params{Dim: d, Basis: b})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pair is two connected hosts with stage services that authorise each
// other for testJob: a is upstream (sends forward), b downstream.
type pair struct {
	a, b         host.Host
	sa, sb       *Service
	authA, authB *StaticAuthorizer
}

func newPair(t testing.TB, specA, specB LinkSpec, opts ...Option) *pair {
	t.Helper()
	p := &pair{a: newHost(t), b: newHost(t), authA: NewStaticAuthorizer(), authB: NewStaticAuthorizer()}
	connect(t, p.a, p.b)
	p.authA.Allow(testJob, p.b.ID(), specA)
	p.authB.Allow(testJob, p.a.ID(), specB)
	p.sa = newService(t, p.a, p.authA, opts...)
	p.sb = newService(t, p.b, p.authB, opts...)
	return p
}

// open dials a → b and returns both ends.
func (p *pair) open(t testing.TB) (up, down *Link) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up, err := p.sa.OpenLink(ctx, p.b.ID(), testJob)
	if err != nil {
		t.Fatal(err)
	}
	down, err = p.sb.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return up, down
}

func randData(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
