package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// hostileStream opens a raw stage stream from h to server and, when id is
// not nil, completes the handshake by hand, so the test can write whatever
// bytes it likes after it.
func hostileStream(t *testing.T, h host.Host, server peer.ID, id *identity, fp [32]byte) (network.Stream, session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := h.NewStream(ctx, server, ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = str.Reset() })
	if id == nil {
		return str, session{}
	}
	_ = str.SetDeadline(time.Now().Add(10 * time.Second))
	sess, err := handshake(str, true, id, h.ID(), server, testJob, fp)
	if err != nil {
		t.Fatalf("hand-rolled handshake: %v", err)
	}
	_ = str.SetDeadline(time.Time{})
	return str, sess
}

// refusalCode reads what the server says before it resets: the code of its
// error frame, or of the reset itself.
func refusalCode(t *testing.T, str network.Stream, sess session) Code {
	t.Helper()
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	var code Code
	if sess.recv != nil {
		r := newRecordReader(sess.recv, str, nil)
		for {
			h, p, err := r.readFrame(func(*header) error { return nil }, func(n int) ([]byte, error) { return make([]byte, n), nil })
			if err != nil {
				code = streamErrCode(t, err)
				break
			}
			if h.Kind == KindError {
				code = Code(binary.BigEndian.Uint16(p))
				if len(p) <= 2 {
					t.Errorf("error frame for code %d carries no reason", code)
				}
				break
			}
		}
	} else {
		_, err := str.Read(make([]byte, 1))
		code = streamErrCode(t, err)
	}
	_ = str.Reset() // ends the server's linger
	return code
}

func streamErrCode(t *testing.T, err error) Code {
	var se *network.StreamError
	if !errors.As(err, &se) || se.ErrorCode&0xffff_0000 != streamCodeBase {
		t.Fatalf("expected a reset carrying a holopeer code, got %v", err)
	}
	return Code(se.ErrorCode & 0xffff)
}

// sealFrame writes a frame whose header the test chooses, bypassing every
// send-side check.
func sealFrame(t *testing.T, w *recordWriter, h header, payload []byte) {
	t.Helper()
	h.Length = uint64(len(payload))
	if err := w.writeFrame(&h, payload); err != nil {
		t.Fatal(err)
	}
}

// TestHostilePeerIsCutOffWhileTheHonestNeighbourIsServed drives a peer
// that completes the handshake and then misbehaves in every way the frame
// checks cover. Each attempt must be refused with the right code, seen by
// both the hostile peer and the server's Recv, while an honest upstream
// keeps streaming to the same server.
func TestHostilePeerIsCutOffWhileTheHonestNeighbourIsServed(t *testing.T) {
	const d, n = 4096, 8 // 128 KiB fp32 frames: three records each
	c := mustCodec(t, codec.FP32, d, nil)
	spec := LinkSpec{Codec: c, Accept: Kinds(KindForward), Tokens: n, Microbatches: 4}
	server, honest, evil := newHost(t), newHost(t), newHost(t)
	connect(t, honest, server)
	connect(t, evil, server)
	auth := NewStaticAuthorizer()
	auth.Allow(testJob, honest.ID(), spec)
	auth.Allow(testJob, evil.ID(), spec)
	srv := newService(t, server, auth, WithIOTimeout(time.Second), WithLingerTimeout(time.Second))
	honestAuth := NewStaticAuthorizer()
	honestAuth.Allow(testJob, server.ID(), LinkSpec{Codec: c, Accept: Kinds(KindBackward), Tokens: n})
	hs := newService(t, honest, honestAuth)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// honestData is frame i of the honest neighbour; both ends derive it.
	honestData := func(i int) []float32 { return randData(rand.New(rand.NewPCG(uint64(i), 99)), n*d) }

	// The server: accept every link, serve each until it fails, and check
	// every honest frame as it arrives.
	type outcome struct {
		peer peer.ID
		err  error
	}
	refused := make(chan outcome, 64)
	var honestGot atomic.Int64
	honestEnd := make(chan error, 1)
	var serving sync.WaitGroup
	serving.Add(1)
	go func() {
		defer serving.Done()
		for {
			l, err := srv.Accept(ctx)
			if err != nil {
				return
			}
			serving.Add(1)
			go func() {
				defer serving.Done()
				for {
					f, err := l.Recv(ctx)
					if l.RemotePeer() == honest.ID() {
						i := int(honestGot.Load())
						switch {
						case err != nil:
							honestEnd <- err
							return
						case f.Kind == KindControl:
							honestEnd <- nil
							return
						case f.Step != uint64(i/4) || f.Micro != uint32(i%4) || !equalF32(f.Data, honestData(i)):
							honestEnd <- fmt.Errorf("honest frame %d differs", i)
							return
						}
						honestGot.Add(1)
						continue
					}
					if err != nil {
						refused <- outcome{l.RemotePeer(), err}
						return
					}
				}
			}()
		}
	}()

	// The honest neighbour streams throughout, a frame every 2 ms.
	up, err := hs.OpenLink(ctx, server.ID(), testJob)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 7))
	stopHonest := make(chan struct{})
	honestSent := make(chan int, 1)
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopHonest:
				_ = up.Send(ctx, Frame{Kind: KindControl, Control: []byte("done")})
				honestSent <- i
				return
			case <-tick.C:
			}
			if err := up.Send(ctx, Frame{Kind: KindForward, Step: uint64(i / 4), Micro: uint32(i % 4), Data: honestData(i)}); err != nil {
				t.Errorf("honest send %d: %v", i, err)
				honestSent <- i
				return
			}
		}
	}()

	evilID, err := newIdentity(evil.Peerstore().PrivKey(evil.ID()), nil)
	if err != nil {
		t.Fatal(err)
	}
	fp := c.Fingerprint()
	good := header{Version: ProtocolVersion, Kind: KindForward, Codec: codec.FP32, Job: testJob, Rows: n, Cols: d}
	goodPayload := make([]byte, c.PayloadSize(codec.Forward, n))
	with := func(f func(*header)) header { h := good; f(&h); return h }
	// raw writes one record with a chosen length prefix and plaintext.
	raw := func(t *testing.T, w *recordWriter, pt []byte) {
		if err := w.seal(pt); err != nil {
			t.Fatal(err)
		}
		if err := w.flush(); err != nil {
			t.Fatal(err)
		}
	}
	hdrBytes := func(h header) []byte { b := make([]byte, HeaderSize); h.encode(b); return b }

	cases := []struct {
		name string
		want Code
		act  func(t *testing.T, str network.Stream, w *recordWriter)
	}{
		{"oversized payload length", CodeTooLarge, func(t *testing.T, _ network.Stream, w *recordWriter) {
			raw(t, w, hdrBytes(with(func(h *header) { h.Length = 1 << 40 })))
		}},
		{"payload length one past the shape", CodeShape, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, good, append(goodPayload, 0))
		}},
		{"wrong d_model", CodeShape, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Cols = d + 1 }), make([]byte, n*(d+1)*4))
		}},
		{"more tokens than the placement", CodeShape, func(t *testing.T, _ network.Stream, w *recordWriter) {
			raw(t, w, hdrBytes(with(func(h *header) { h.Rows = n + 1; h.Length = uint64((n + 1) * d * 4) })))
		}},
		{"codec the job does not use", CodeShape, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Codec = codec.BF16 }), make([]byte, n*d*2))
		}},
		{"step out of the window", CodeStep, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Step = 1000 }), goodPayload)
		}},
		{"step going back", CodeStep, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Step = 1 }), goodPayload)
			sealFrame(t, w, with(func(h *header) { h.Step = 0 }), goodPayload)
		}},
		{"microbatch past the step", CodeStep, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Micro = 4 }), goodPayload)
		}},
		{"unknown kind", CodeUnexpectedKind, func(t *testing.T, _ network.Stream, w *recordWriter) {
			raw(t, w, hdrBytes(with(func(h *header) { h.Kind = 9 })))
		}},
		{"kind this link does not accept", CodeUnexpectedKind, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Kind = KindBackward }), goodPayload)
		}},
		{"another job's frame", CodeMalformed, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Job[0] ^= 1 }), goodPayload)
		}},
		{"future protocol version", CodeMalformed, func(t *testing.T, _ network.Stream, w *recordWriter) {
			sealFrame(t, w, with(func(h *header) { h.Version = 2 }), goodPayload)
		}},
		{"NaN activations", CodeBadPayload, func(t *testing.T, _ network.Stream, w *recordWriter) {
			p := bytes.Clone(goodPayload)
			binary.LittleEndian.PutUint32(p[4*1000:], math.Float32bits(float32(math.NaN())))
			sealFrame(t, w, good, p)
		}},
		{"record of the wrong size inside a frame", CodeMalformed, func(t *testing.T, _ network.Stream, w *recordWriter) {
			first := append(hdrBytes(with(func(h *header) { h.Length = uint64(len(goodPayload)) })), goodPayload[:firstChunk]...)
			if err := w.seal(first); err != nil {
				t.Fatal(err)
			}
			raw(t, w, goodPayload[:1000])
		}},
		{"record too short for a header", CodeMalformed, func(t *testing.T, _ network.Stream, w *recordWriter) {
			raw(t, w, []byte("tiny"))
		}},
		{"stall mid-frame", CodeTimeout, func(t *testing.T, _ network.Stream, w *recordWriter) {
			first := append(hdrBytes(with(func(h *header) { h.Length = uint64(len(goodPayload)) })), goodPayload[:firstChunk]...)
			raw(t, w, first)
		}},
		{"frame cut short", CodeMalformed, func(t *testing.T, str network.Stream, w *recordWriter) {
			first := append(hdrBytes(with(func(h *header) { h.Length = uint64(len(goodPayload)) })), goodPayload[:firstChunk]...)
			raw(t, w, first)
			_ = str.CloseWrite()
		}},
		{"garbage after the handshake", CodeDecrypt, func(t *testing.T, str network.Stream, _ *recordWriter) {
			g := make([]byte, 2+4096)
			binary.BigEndian.PutUint16(g, 4096)
			for i := 2; i < len(g); i++ {
				g[i] = byte(r.Uint32())
			}
			if _, err := str.Write(g); err != nil {
				t.Fatal(err)
			}
		}},
		{"tampered ciphertext", CodeDecrypt, func(t *testing.T, str network.Stream, w *recordWriter) {
			h := good
			h.Length = uint64(len(goodPayload))
			w.w = &flipWriter{w: str, at: 100}
			if err := w.writeFrame(&h, goodPayload); err != nil {
				t.Fatal(err)
			}
		}},
		{"replayed record", CodeDecrypt, func(t *testing.T, str network.Stream, w *recordWriter) {
			rec := &recordingWriter{w: str}
			w.w = rec
			sealFrame(t, w, with(func(h *header) { h.Rows = n }), goodPayload)
			if _, err := str.Write(rec.buf[:recordPrefix+MaxRecord]); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			str, sess := hostileStream(t, evil, server.ID(), evilID, fp)
			w := newRecordWriter(sess.send, str, nil)
			tc.act(t, str, w)
			if got := refusalCode(t, str, sess); got != tc.want {
				t.Fatalf("hostile peer saw code %d (%s), want %d (%s)", got, got, tc.want, tc.want)
			}
			select {
			case o := <-refused:
				if o.peer != evil.ID() {
					t.Fatalf("the server refused %s, not the hostile peer: %v", o.peer, o.err)
				}
				var we *Error
				if !errors.As(o.err, &we) || we.Code != tc.want || we.Remote || !errors.Is(o.err, codeSentinel[tc.want]) {
					t.Fatalf("server's Recv returned %v, want a local %s refusal", o.err, tc.want)
				}
				t.Logf("server: %v", o.err)
			case <-ctx.Done():
				t.Fatal("the server never reported the refusal")
			}
		})
	}

	// Attempts refused during the handshake: nothing reaches Accept.
	t.Run("garbage instead of a handshake", func(t *testing.T) {
		str, _ := hostileStream(t, evil, server.ID(), nil, fp)
		pre := append([]byte{ProtocolVersion}, testJob[:]...)
		_, _ = str.Write(append(pre, 0, 64))
		_, _ = str.Write(make([]byte, 64))
		if got := refusalCode(t, str, session{}); got != CodeHandshake {
			t.Fatalf("code %s", got)
		}
	})
	t.Run("static key signed by another identity", func(t *testing.T) {
		other, _, _ := crypto.GenerateEd25519Key(nil)
		forged, err := newIdentity(other, nil)
		if err != nil {
			t.Fatal(err)
		}
		str, _ := hostileStream(t, evil, server.ID(), nil, fp)
		_ = str.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = handshake(str, true, forged, evil.ID(), server.ID(), testJob, fp)
		if err != nil {
			t.Fatalf("initiator side failed early: %v", err)
		}
		if got := refusalCode(t, str, session{}); got != CodeHandshake {
			t.Fatalf("code %s", got)
		}
	})
	t.Run("signature over a different static key", func(t *testing.T) {
		replay := *evilID
		k, _ := cipherSuite.GenerateKeypair(nil)
		replay.static = k // the signature still covers evilID's old key
		str, _ := hostileStream(t, evil, server.ID(), nil, fp)
		_ = str.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := handshake(str, true, &replay, evil.ID(), server.ID(), testJob, fp); err != nil {
			t.Fatalf("initiator side failed early: %v", err)
		}
		if got := refusalCode(t, str, session{}); got != CodeHandshake {
			t.Fatalf("code %s", got)
		}
	})
	t.Run("peer outside the placement", func(t *testing.T) {
		stranger := newHost(t)
		connect(t, stranger, server)
		sid, _ := newIdentity(stranger.Peerstore().PrivKey(stranger.ID()), nil)
		str, _ := hostileStream(t, stranger, server.ID(), nil, fp)
		_ = str.SetDeadline(time.Now().Add(10 * time.Second))
		_, err := handshake(str, true, sid, stranger.ID(), server.ID(), testJob, fp)
		if got := streamErrCode(t, err); got != CodeNotAuthorized {
			t.Fatalf("code %s", got)
		}
	})

	// The honest neighbour was served throughout and still is.
	duringAttacks := honestGot.Load()
	close(stopHonest)
	total := <-honestSent
	if err := <-honestEnd; err != nil {
		t.Fatalf("honest link: %v", err)
	}
	if got := honestGot.Load(); got != int64(total) || duringAttacks == 0 {
		t.Fatalf("server checked %d of %d honest frames (%d during the attacks)", got, total, duringAttacks)
	}
	t.Logf("honest neighbour: %d frames of %d KiB delivered intact around %d hostile attempts", total, n*d*4/1024, len(cases)+4)
	if err := up.Close(); err != nil {
		t.Fatal(err)
	}
	cancel()
	serving.Wait()
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// flipWriter flips one bit of the byte at offset at.
type flipWriter struct {
	w   interface{ Write([]byte) (int, error) }
	at  int
	off int
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if f.at >= f.off && f.at < f.off+len(p) {
		p = bytes.Clone(p)
		p[f.at-f.off] ^= 0x20
	}
	f.off += len(p)
	return f.w.Write(p)
}

// recordingWriter keeps a copy of what it writes.
type recordingWriter struct {
	w   interface{ Write([]byte) (int, error) }
	buf []byte
}

func (r *recordingWriter) Write(p []byte) (int, error) {
	r.buf = append(r.buf, p...)
	return r.w.Write(p)
}

func TestHandshakeRefusalsThroughTheAPI(t *testing.T) {
	b1, _ := subspace.New(subspace.Config{Dim: 64, Rank: 8, Vocab: 100, Seed: 1})
	b2, _ := subspace.New(subspace.Config{Dim: 64, Rank: 8, Vocab: 100, Seed: 2})
	c1 := mustCodec(t, codec.SubspaceBF16, 64, b1)
	ctx := ctxT(t)

	t.Run("different subspace seeds", func(t *testing.T) {
		p := newPair(t, LinkSpec{Codec: c1, Accept: Kinds(KindBackward)}, LinkSpec{Codec: mustCodec(t, codec.SubspaceBF16, 64, b2), Accept: Kinds(KindForward)})
		_, err := p.sa.OpenLink(ctx, p.b.ID(), testJob)
		if !errors.Is(err, ErrSpecMismatch) {
			t.Fatalf("OpenLink across different bases: %v", err)
		}
	})
	t.Run("different codecs", func(t *testing.T) {
		p := newPair(t, LinkSpec{Codec: c1}, LinkSpec{Codec: mustCodec(t, codec.BF16, 64, nil)})
		if _, err := p.sa.OpenLink(ctx, p.b.ID(), testJob); !errors.Is(err, ErrSpecMismatch) {
			t.Fatalf("OpenLink across codecs: %v", err)
		}
	})
	t.Run("responder does not know the initiator", func(t *testing.T) {
		p := newPair(t, LinkSpec{Codec: c1}, LinkSpec{Codec: c1})
		p.authB.Revoke(testJob, p.a.ID())
		_, err := p.sa.OpenLink(ctx, p.b.ID(), testJob)
		var we *Error
		if !errors.Is(err, ErrNotAuthorized) || !errors.As(err, &we) || !we.Remote {
			t.Fatalf("OpenLink to a stage that does not place us: %v", err)
		}
	})
	t.Run("initiator does not know the responder", func(t *testing.T) {
		p := newPair(t, LinkSpec{Codec: c1}, LinkSpec{Codec: c1})
		other := JobID{9}
		if _, err := p.sa.OpenLink(ctx, p.b.ID(), other); !errors.Is(err, ErrNotAuthorized) {
			t.Fatalf("OpenLink for a job we are not placed in: %v", err)
		}
	})
}
