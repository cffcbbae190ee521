package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/wire"
)

// pipeLink is an in-memory frameLink: what one end sends, the other
// receives, each frame copied as a socket would.
type pipeLink struct {
	out chan<- wire.Frame
	in  <-chan wire.Frame
}

func pipePair() (a, b *pipeLink) {
	ab, ba := make(chan wire.Frame, 64), make(chan wire.Frame, 64)
	return &pipeLink{out: ab, in: ba}, &pipeLink{out: ba, in: ab}
}

func (p *pipeLink) Send(ctx context.Context, f wire.Frame) error {
	f.Control = bytes.Clone(f.Control)
	select {
	case p.out <- f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *pipeLink) Recv(ctx context.Context) (wire.Frame, error) {
	select {
	case f, ok := <-p.in:
		if !ok {
			return wire.Frame{}, io.EOF
		}
		return f, nil
	case <-ctx.Done():
		return wire.Frame{}, ctx.Err()
	}
}

// pattern is a synthetic blob: size bytes of a repeating 1 MiB block,
// written without ever existing whole.
func pattern(size int64) (block []byte, write func(io.Writer) error) {
	block = make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i*7 + i>>11)
	}
	return block, func(w io.Writer) error {
		for left := size; left > 0; {
			n := min(left, int64(len(block)))
			if _, err := w.Write(block[:n]); err != nil {
				return err
			}
			left -= n
		}
		return nil
	}
}

// checkWriter compares what it is given with the pattern as it arrives.
type checkWriter struct {
	block []byte
	n     int64
	bad   error
}

func (c *checkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); {
		at := int(c.n % int64(len(c.block)))
		k := min(len(p)-off, len(c.block)-at)
		if c.bad == nil && !bytes.Equal(p[off:off+k], c.block[at:at+k]) {
			c.bad = fmt.Errorf("byte %d differs", c.n)
		}
		off, c.n = off+k, c.n+int64(k)
	}
	return len(p), nil
}

// TestBlobStreamsPastFourGiB: a shard larger than 4 GiB (a synthetic
// stream, never allocated) crosses a link with 64-bit sizes, arrives
// byte for byte and passes its hash; neither side holds more than a
// chunk.
func TestBlobStreamsPastFourGiB(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 4 GiB")
	}
	const size = 4<<30 + 12345
	a, b := pipePair()
	ctx := context.Background()
	block, write := pattern(size)
	sent := make(chan error, 1)
	go func() { sent <- sendBlobFrom(ctx, a, Ctl{Name: opShard, Step: 9}, size, write) }()
	f, err := b.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := decodeCtl(f.Control)
	if err != nil || hdr.Op != opBlob || hdr.Size != size {
		t.Fatalf("header %+v, %v", hdr, err)
	}
	cw := &checkWriter{block: block}
	if err := recvBlobTo(ctx, b, hdr, size, cw); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if cw.n != size || cw.bad != nil {
		t.Fatalf("received %d of %d bytes: %v", cw.n, int64(size), cw.bad)
	}
}

// recvHeader starts a blob of size bytes from a and reads its header at b.
func recvHeader(t *testing.T, a, b *pipeLink, size int64, write func(io.Writer) error) (Ctl, chan error) {
	t.Helper()
	sent := make(chan error, 1)
	go func() { sent <- sendBlobFrom(context.Background(), a, Ctl{Name: opShard}, size, write) }()
	f, err := b.Recv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := decodeCtl(f.Control)
	if err != nil {
		t.Fatal(err)
	}
	return hdr, sent
}

// A blob larger than its receiver expects is refused before a byte of it
// is taken, and the error names both sizes.
func TestBlobLargerThanPlanIsRefused(t *testing.T) {
	a, b := pipePair()
	_, write := pattern(5 << 20)
	hdr, _ := recvHeader(t, a, b, 5<<20, write)
	var sink bytes.Buffer
	err := recvBlobTo(context.Background(), b, hdr, 4<<20, &sink)
	if !errors.Is(err, ErrBlobTooLarge) || !strings.Contains(err.Error(), "5242880") || !strings.Contains(err.Error(), "4194304") {
		t.Fatalf("err = %v, want ErrBlobTooLarge naming 5242880 and 4194304", err)
	}
	if sink.Len() != 0 {
		t.Fatalf("%d bytes taken before the refusal", sink.Len())
	}
}

// A blob whose bytes were changed on the way fails its hash; one cut
// short by another frame, or longer than announced, is refused.
func TestBlobTamperingIsRefused(t *testing.T) {
	ctx := context.Background()
	t.Run("corrupt", func(t *testing.T) {
		a, b := pipePair()
		_, write := pattern(10000)
		hdr, _ := recvHeader(t, a, b, 10000, write)
		flip := &flipLink{pipeLink: b}
		err := recvBlobTo(ctx, flip, hdr, 1<<20, io.Discard)
		if !errors.Is(err, ErrBlobCorrupt) {
			t.Fatalf("err = %v, want ErrBlobCorrupt", err)
		}
	})
	t.Run("interrupted", func(t *testing.T) {
		a, b := pipePair()
		go func() {
			sendCtl(ctx, a, Ctl{Op: opBlob, Name: opShard, Size: 100})
			sendCtl(ctx, a, Ctl{Op: opApply, Step: 1})
		}()
		f, _ := b.Recv(ctx)
		hdr, _ := decodeCtl(f.Control)
		if _, err := recvBlob(ctx, b, hdr, 1<<20); err == nil {
			t.Fatal("a blob interrupted by a control message was accepted")
		}
	})
	t.Run("longer", func(t *testing.T) {
		a, b := pipePair()
		go func() {
			sendCtl(ctx, a, Ctl{Op: opBlob, Name: opShard, Size: 10})
			a.Send(ctx, wire.Frame{Kind: wire.KindControl, Control: append([]byte{msgChunk}, make([]byte, 11)...)})
		}()
		f, _ := b.Recv(ctx)
		hdr, _ := decodeCtl(f.Control)
		if _, err := recvBlob(ctx, b, hdr, 1<<20); err == nil {
			t.Fatal("a blob longer than announced was accepted")
		}
	})
	t.Run("sender short", func(t *testing.T) {
		a, _ := pipePair()
		err := sendBlobFrom(ctx, a, Ctl{Name: opShard}, 10, func(w io.Writer) error { _, err := w.Write([]byte("abc")); return err })
		if err == nil {
			t.Fatal("a sender that wrote less than it announced did not fail")
		}
	})
}

// flipLink flips one bit of the first chunk it receives.
type flipLink struct {
	*pipeLink
	done bool
}

func (f *flipLink) Recv(ctx context.Context) (wire.Frame, error) {
	fr, err := f.pipeLink.Recv(ctx)
	if err == nil && !f.done && len(fr.Control) > 10 && fr.Control[0] == msgChunk {
		fr.Control[5] ^= 1
		f.done = true
	}
	return fr, err
}

// FuzzReadCtl: whatever frames arrive after a control frame, reading it
// (and any blob) returns a message or an error, never panics, and never
// takes more than the rule allows.
func FuzzReadCtl(f *testing.F) {
	good, _ := encodeCtl(Ctl{Op: opBlob, Name: opShard, Size: 3})
	end, _ := encodeCtl(Ctl{Op: opBlobEnd, Hash: make([]byte, 32)})
	f.Add(good, []byte{msgChunk, 1, 2, 3}, end)
	f.Add([]byte{msgCtl, '{', '}'}, []byte{}, []byte{})
	f.Add(end, good, good)
	f.Fuzz(func(t *testing.T, first, second, third []byte) {
		a, b := pipePair()
		ctx := context.Background()
		for _, p := range [][]byte{second, third} {
			if len(p) <= wire.MaxControlPayload {
				a.Send(ctx, wire.Frame{Kind: wire.KindControl, Control: p})
			}
		}
		close(a.out)
		rule := func(h Ctl) (int64, string) { return 64, "" }
		_, blob, _, err := readCtl(ctx, b, wire.Frame{Kind: wire.KindControl, Control: first}, rule)
		if err == nil && len(blob) > 64 {
			t.Fatalf("took %d bytes over a 64-byte rule", len(blob))
		}
	})
}
