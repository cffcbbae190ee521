package wire

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

func TestLinkCarriesForwardAndBackwardConcurrently(t *testing.T) {
	const d, n, steps = 512, 80, 6 // 80×512×2 = 80 KiB of bf16: two records a frame
	c := mustCodec(t, codec.BF16, d, nil)
	p := newPair(t,
		LinkSpec{Codec: c, Accept: Kinds(KindBackward), Tokens: n},
		LinkSpec{Codec: c, Accept: Kinds(KindForward), Tokens: n, Microbatches: 2})
	up, down := p.open(t)
	if up.Path() != "direct" || down.RemotePeer() != p.a.ID() {
		t.Fatalf("path %s, remote %s", up.Path(), down.RemotePeer())
	}
	ctx := ctxT(t)
	r := rand.New(rand.NewPCG(1, 2))
	fwd := make([][]float32, steps*2)
	bwd := make([][]float32, steps*2)
	for i := range fwd {
		fwd[i], bwd[i] = randData(r, n*d), randData(r, n*d)
	}
	errc := make(chan error, 2)
	polling := make(chan struct{})
	defer close(polling)
	go func() { // a dashboard reading counters while frames move
		for {
			select {
			case <-polling:
				return
			default:
				_, _ = up.Stats(), down.Stats()
			}
		}
	}()
	go func() { // upstream: forward out
		for i, x := range fwd {
			if err := up.Send(ctx, Frame{Kind: KindForward, Step: uint64(i / 2), Micro: uint32(i % 2), Data: x}); err != nil {
				errc <- err
				return
			}
		}
		errc <- up.CloseSend()
	}()
	go func() { // downstream: backward out
		for i, g := range bwd {
			if err := down.Send(ctx, Frame{Kind: KindBackward, Step: uint64(i / 2), Micro: uint32(i % 2), Data: g}); err != nil {
				errc <- err
				return
			}
		}
		errc <- down.CloseSend()
	}()
	check := func(l *Link, kind Kind, want [][]float32) {
		t.Helper()
		for i, x := range want {
			f, err := l.Recv(ctx)
			if err != nil {
				t.Fatalf("%s frame %d: %v", kind, i, err)
			}
			if f.Kind != kind || f.Step != uint64(i/2) || f.Micro != uint32(i%2) || f.Tokens != n {
				t.Fatalf("%s frame %d: got %s step %d micro %d tokens %d", kind, i, f.Kind, f.Step, f.Micro, f.Tokens)
			}
			for j := range x {
				h, _ := codec.ToBF16(x[j])
				if f.Data[j] != codec.FromBF16(h) {
					t.Fatalf("%s frame %d value %d: %g, want bf16(%g)", kind, i, j, f.Data[j], x[j])
				}
			}
		}
		if _, err := l.Recv(ctx); !errors.Is(err, io.EOF) {
			t.Fatalf("after the last %s frame: %v, want EOF", kind, err)
		}
	}
	check(down, KindForward, fwd)
	check(up, KindBackward, bwd)
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	st := up.Stats()
	if st.FramesSent != uint64(len(fwd)) || st.TokensSent != uint64(n*len(fwd)) || st.PayloadSent != int64(len(fwd)*n*d*2) {
		t.Fatalf("sender stats %+v", st)
	}
	// On the wire: payload + one header and 2+16 bytes per record.
	records := int64(len(fwd)) * 2
	if want := st.PayloadSent + int64(len(fwd))*HeaderSize + records*(recordPrefix+TagSize); st.BytesSent != want {
		t.Fatalf("%d bytes on the stream, want %d", st.BytesSent, want)
	}
	if want := int64(len(fwd) * FrameWireBytes(n*d*2)); st.BytesSent != want {
		t.Fatalf("%d bytes on the stream, FrameWireBytes says %d", st.BytesSent, want)
	}
	if rs := down.Stats(); rs.BytesRecv != st.BytesSent || rs.FramesRecv != st.FramesSent {
		t.Fatalf("receiver saw %d bytes / %d frames, sender wrote %d / %d", rs.BytesRecv, rs.FramesRecv, st.BytesSent, st.FramesSent)
	}
}

func TestSubspaceLinkRebuildsActivationsAndMonitorsTheInvariant(t *testing.T) {
	const d, k, n = 1024, 40, 16
	b, err := subspace.New(subspace.Config{Dim: d, Rank: k, Vocab: 50257, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	c := mustCodec(t, codec.SubspaceFP32, d, b)
	p := newPair(t, LinkSpec{Codec: c, Accept: Kinds(KindBackward)}, LinkSpec{Codec: c, Accept: Kinds(KindForward)})
	up, down := p.open(t)
	ctx := ctxT(t)
	r := rand.New(rand.NewPCG(3, 4))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = r.IntN(50257)
	}
	h := make([]float32, n*d)
	b.Decode(randData(r, n*k), ids, h) // a constrained model's activations
	if err := up.Send(ctx, Frame{Kind: KindForward, Data: h, IDs: ids}); err != nil {
		t.Fatal(err)
	}
	f, err := down.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var num, den float64
	e := make([]float32, d)
	for tok := range n {
		if f.IDs[tok] != ids[tok] {
			t.Fatalf("token %d: id %d, want %d", tok, f.IDs[tok], ids[tok])
		}
		b.EFixRow(ids[tok], e)
		for i := range d {
			x, y := float64(h[tok*d+i]), float64(f.Data[tok*d+i])
			num += (x - y) * (x - y)
			den += (x - float64(e[i])) * (x - float64(e[i]))
		}
	}
	if rel := math.Sqrt(num / den); rel > 1e-6 {
		t.Fatalf("rebuilt activations off by %g relative", rel)
	}
	if st := up.Stats(); st.LastResidual > 1e-6 || st.PayloadSent != int64(n*(2+4*k)) {
		t.Fatalf("stats %+v", st)
	}

	// Activations that left span(U) are refused before anything is sent,
	// and the link stays usable.
	bad := randData(r, n*d)
	err = up.Send(ctx, Frame{Kind: KindForward, Step: 1, Data: bad, IDs: ids})
	if !errors.Is(err, ErrInvariant) {
		t.Fatalf("Send of unconstrained activations: %v, want ErrInvariant", err)
	}
	if st := up.Stats(); st.MaxResidual < 0.5 || st.FramesSent != 1 {
		t.Fatalf("stats after the refused send %+v", st)
	}
	g := make([]float32, n*d)
	b.LiftGrad(randData(r, n*k), n, g)
	if err := down.Send(ctx, Frame{Kind: KindBackward, Data: g}); err != nil {
		t.Fatal(err)
	}
	if f, err = up.Recv(ctx); err != nil || f.Kind != KindBackward || f.IDs != nil {
		t.Fatalf("backward: %v %+v", err, f.Kind)
	}
	if err := up.Send(ctx, Frame{Kind: KindForward, Step: 1, Data: h, IDs: ids}); err != nil {
		t.Fatalf("link unusable after a refused send: %v", err)
	}
	if f, err = down.Recv(ctx); err != nil || f.Step != 1 {
		t.Fatalf("second forward: %v", err)
	}
}

func TestControlFramesAndSendSideChecks(t *testing.T) {
	c := mustCodec(t, codec.FP32, 8, nil)
	p := newPair(t, LinkSpec{Codec: c, Accept: Kinds(KindBackward), Tokens: 2}, LinkSpec{Codec: c, Accept: Kinds(KindForward), Tokens: 2})
	up, down := p.open(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		f    Frame
		want error
	}{
		{Frame{Kind: KindForward, Data: make([]float32, 3*8)}, ErrShape},
		{Frame{Kind: KindForward, Data: make([]float32, 7)}, ErrShape},
		{Frame{Kind: KindForward, Data: []float32{float32(math.Inf(1)), 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}}, ErrBadPayload},
		{Frame{Kind: KindError}, ErrUnexpectedKind},
		{Frame{Kind: KindControl, Control: make([]byte, MaxControlPayload+1)}, ErrTooLarge},
	} {
		if err := up.Send(ctx, tc.f); !errors.Is(err, tc.want) {
			t.Fatalf("Send(%s, %d values) = %v, want %v", tc.f.Kind, len(tc.f.Data), err, tc.want)
		}
	}
	if err := up.Send(ctx, Frame{Kind: KindControl, Step: 3, Control: []byte("drain")}); err != nil {
		t.Fatal(err)
	}
	f, err := down.Recv(ctx)
	if err != nil || f.Kind != KindControl || string(f.Control) != "drain" || f.Step != 3 {
		t.Fatalf("control frame: %v %+v", err, f)
	}
}

func TestRecvTimeoutBetweenFramesKeepsTheLink(t *testing.T) {
	c := mustCodec(t, codec.FP32, 4, nil)
	p := newPair(t, LinkSpec{Codec: c}, LinkSpec{Codec: c, Accept: Kinds(KindForward)})
	up, down := p.open(t)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := down.Recv(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv with an expiring context: %v", err)
	}
	ctx := ctxT(t)
	if err := up.Send(ctx, Frame{Kind: KindForward, Data: []float32{1, 2, 3, 4}}); err != nil {
		t.Fatal(err)
	}
	if f, err := down.Recv(ctx); err != nil || f.Data[3] != 4 {
		t.Fatalf("after a timed-out Recv: %v", err)
	}
}

func TestServiceCloseResetsLinksAndStopsAccepting(t *testing.T) {
	c := mustCodec(t, codec.FP32, 4, nil)
	p := newPair(t, LinkSpec{Codec: c, Accept: Kinds(KindBackward)}, LinkSpec{Codec: c, Accept: Kinds(KindForward)})
	up, _ := p.open(t)
	if err := p.sb.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := up.Recv(ctx); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Recv after the peer's service closed: %v, want ErrShutdown", err)
	}
	if _, err := p.sb.Accept(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if _, err := p.sa.OpenLink(ctx, p.b.ID(), testJob); err == nil {
		t.Fatal("OpenLink to a closed service succeeded")
	}
	if _, err := p.sb.OpenLink(ctx, p.a.ID(), testJob); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenLink on a closed service: %v", err)
	}
}

// TestTensorBytesCountTheSocket: the tensor counters hold the stream bytes
// of forward and backward frames alone, above their codec payload by the
// header, record lengths and tags, and the same on both ends; control
// frames on the same stream are not counted.
func TestTensorBytesCountTheSocket(t *testing.T) {
	const d, n = 512, 80
	c := mustCodec(t, codec.BF16, d, nil)
	p := newPair(t, LinkSpec{Codec: c, Accept: Kinds(KindBackward), Tokens: n}, LinkSpec{Codec: c, Accept: Kinds(KindForward), Tokens: n})
	up, down := p.open(t)
	ctx := ctxT(t)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 3 {
		if err := up.Send(ctx, Frame{Kind: KindControl, Step: uint64(i), Control: make([]byte, 1000)}); err != nil {
			t.Fatal(err)
		}
		if err := up.Send(ctx, Frame{Kind: KindForward, Step: uint64(i), Data: randData(r, n*d)}); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := down.Recv(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	sent, got := up.Stats(), down.Stats()
	payload := int64(3 * n * d * 2)
	if sent.TensorBytesSent != got.TensorBytesRecv || sent.TensorTokensSent != 3*n || got.TensorTokensRecv != 3*n {
		t.Fatalf("sent %d bytes / %d tokens, received %d / %d", sent.TensorBytesSent, sent.TensorTokensSent, got.TensorBytesRecv, got.TensorTokensRecv)
	}
	if sent.TensorBytesSent <= payload || sent.TensorBytesSent >= sent.BytesSent {
		t.Fatalf("tensor frames took %d stream bytes for %d of payload, of %d on the stream", sent.TensorBytesSent, payload, sent.BytesSent)
	}
	t.Logf("%.1f stream bytes per token for %d of payload", float64(sent.TensorBytesSent)/float64(3*n), 2*d)
}
