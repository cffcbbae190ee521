package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

// tap is a TCP forwarder in front of the relay that keeps a copy of every
// byte in either direction: exactly what the relay receives and sends on
// its connections to the two stages.
type tap struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	buf    bytes.Buffer
	wg     sync.WaitGroup
}

func newTap(t *testing.T, target string) *tap {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{ln: ln, target: target}
	tp.wg.Add(1)
	go tp.serve()
	t.Cleanup(func() { _ = ln.Close(); tp.wg.Wait() })
	return tp
}

func (tp *tap) serve() {
	defer tp.wg.Done()
	for {
		c, err := tp.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", tp.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		tp.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer tp.wg.Done()
			defer dst.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					tp.mu.Lock()
					tp.buf.Write(buf[:n])
					tp.mu.Unlock()
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

func (tp *tap) captured() []byte {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return bytes.Clone(tp.buf.Bytes())
}

func (tp *tap) addr(t *testing.T) ma.Multiaddr {
	a, err := manet.FromNetAddr(tp.ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRelayForwardsOnlyCiphertext puts a circuit relay between two stages
// and captures every byte it forwards. The stage hosts run libp2p with
// transport security switched off, so the only thing that can hide the
// tensor from the relay is the Noise session inside the stage stream. A
// control stream over the same relayed connection shows the capture does
// see plaintext when it is there.
func TestRelayForwardsOnlyCiphertext(t *testing.T) {
	insecure := []libp2p.Option{libp2p.NoSecurity}
	relay := newHost(t, insecure...)
	if _, err := relayv2.New(relay, relayv2.WithInfiniteLimits()); err != nil {
		t.Fatal(err)
	}
	relayTCP, err := manet.ToNetAddr(relay.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	tp := newTap(t, relayTCP.String())
	viaTap := peer.AddrInfo{ID: relay.ID(), Addrs: []ma.Multiaddr{tp.addr(t)}}

	// The stages do not listen at all: the relay is their only path.
	stage := func() host.Host {
		return newHost(t, append(insecure, libp2p.NoListenAddrs, libp2p.EnableRelay())...)
	}
	down, up := stage(), stage()
	ctx := ctxT(t)
	for _, h := range []host.Host{down, up} {
		if err := h.Connect(ctx, viaTap); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Reserve(ctx, down, viaTap); err != nil {
		t.Fatalf("reservation: %v", err)
	}
	circuit := tp.addr(t).Encapsulate(ma.StringCast("/p2p/" + relay.ID().String() + "/p2p-circuit"))
	if err := up.Connect(ctx, peer.AddrInfo{ID: down.ID(), Addrs: []ma.Multiaddr{circuit}}); err != nil {
		t.Fatalf("dial through the relay: %v", err)
	}

	// The secret: fp32 activations whose bytes spell a recognisable text.
	const d, n = 256, 64
	var text bytes.Buffer
	for i := 0; text.Len() < n*d*4; i++ {
		fmt.Fprintf(&text, "holopeer-secret-activation-%06d|", i)
	}
	secret := text.Bytes()[:n*d*4]
	data := make([]float32, n*d)
	for i := range data {
		data[i] = math.Float32frombits(binary.LittleEndian.Uint32(secret[4*i:]))
	}

	// Control: the same bytes on a plain stream over the same relayed
	// connection are visible in the capture.
	const plain = "/holopeer/test/plaintext/1"
	got := make(chan []byte, 1)
	down.SetStreamHandler(plain, func(s network.Stream) {
		b, _ := io.ReadAll(s)
		got <- b
		_ = s.Close()
	})
	s, err := up.NewStream(network.WithAllowLimitedConn(ctx, "test"), down.ID(), plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(secret[:4096]); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseWrite()
	<-got
	if !bytes.Contains(tp.captured(), secret[:4096]) {
		t.Fatal("control failed: plaintext sent over the relay is not in the capture, so the capture proves nothing")
	}
	before := len(tp.captured())

	// The stage link over the same relay.
	c := mustCodec(t, codec.FP32, d, nil)
	authDown, authUp := NewStaticAuthorizer(), NewStaticAuthorizer()
	authDown.Allow(testJob, up.ID(), LinkSpec{Codec: c, Accept: Kinds(KindForward)})
	authUp.Allow(testJob, down.ID(), LinkSpec{Codec: c, Accept: Kinds(KindBackward)})
	sDown, sUp := newService(t, down, authDown), newService(t, up, authUp)
	l, err := sUp.OpenLink(ctx, down.ID(), testJob)
	if err != nil {
		t.Fatal(err)
	}
	if l.Path() != "relayed" {
		t.Fatalf("link path %q, want relayed", l.Path())
	}
	r, err := sDown.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Send(ctx, Frame{Kind: KindForward, Step: 0, Data: data}); err != nil {
		t.Fatal(err)
	}
	f, err := r.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !equalF32(f.Data, data) {
		t.Fatal("the tensor arrived changed")
	}
	_ = l.Close()
	// Let the last bytes through the tap before reading it.
	deadline := time.Now().Add(5 * time.Second)
	var capture []byte
	for {
		capture = tp.captured()
		if int64(len(capture)-before) >= 2*l.Stats().BytesSent || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	forwarded := len(capture) - before
	if int64(forwarded) < l.Stats().BytesSent {
		t.Fatalf("the relay forwarded %d bytes after the control, the link sent %d: the link did not use the relay", forwarded, l.Stats().BytesSent)
	}
	// Neither the text nor any 16-byte piece of the tensor's bytes appears.
	after := capture[before:]
	if bytes.Contains(after, []byte("holopeer-secret")) {
		t.Fatal("the relay saw the pattern text")
	}
	for off := 0; off+16 <= len(secret); off += 4 {
		if bytes.Contains(after, secret[off:off+16]) {
			t.Fatalf("the relay saw tensor bytes %d..%d in plaintext", off, off+16)
		}
	}
	t.Logf("relay forwarded %d bytes for a %d-byte tensor; none of it plaintext", forwarded, len(secret))
}
