package peer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
)

func loopback(t testing.TB) Option {
	return WithListen(ma.StringCast("/ip4/127.0.0.1/tcp/0"))
}

func startHost(t testing.TB, swarm string, boot []lpeer.AddrInfo, extra ...Option) *Host {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]Option{WithIdentity(key), WithSwarm(swarm), loopback(t), WithBootstrap(boot...), WithRendezvousInterval(time.Second)}, extra...)
	h, err := New(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func infoOf(h *Host) lpeer.AddrInfo { return lpeer.AddrInfo{ID: h.ID(), Addrs: h.Libp2p().Addrs()} }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v: %v", what, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func memberSet(h *Host) map[lpeer.ID]Member {
	out := map[lpeer.ID]Member{}
	for _, m := range h.Members() {
		out[m.ID] = m
	}
	return out
}

// TestRendezvousTwentyHosts: 20 real hosts on loopback sockets, one
// bootstrap; every member of swarm "alpha" finds every other member, and
// the members of swarm "beta" (same DHT, same bootstrap) stay out.
func TestRendezvousTwentyHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 20 hosts")
	}
	boot := startHost(t, "alpha", nil)
	alpha := []*Host{boot}
	var beta []*Host
	for i := 1; i < 20; i++ {
		if i%4 == 0 {
			beta = append(beta, startHost(t, "beta", []lpeer.AddrInfo{infoOf(boot)}))
		} else {
			alpha = append(alpha, startHost(t, "alpha", []lpeer.AddrInfo{infoOf(boot)}))
		}
	}
	check := func(group []*Host, others []*Host) func() error {
		return func() error {
			for _, h := range group {
				ms := memberSet(h)
				for _, o := range group {
					if o == h {
						continue
					}
					if _, ok := ms[o.ID()]; !ok {
						return fmt.Errorf("%s does not list %s (has %d members)", h.ID(), o.ID(), len(ms))
					}
				}
				for _, o := range others {
					if _, ok := ms[o.ID()]; ok {
						return fmt.Errorf("%s lists %s of another swarm", h.ID(), o.ID())
					}
				}
			}
			return nil
		}
	}
	start := time.Now()
	waitFor(t, 45*time.Second, "alpha members find each other", check(alpha, beta))
	waitFor(t, 30*time.Second, "beta members find each other", check(beta, alpha))
	t.Logf("%d alpha and %d beta hosts converged in %v", len(alpha), len(beta), time.Since(start))
	for _, m := range alpha[1].Members() {
		if m.Conn != ConnDirect {
			t.Errorf("member %s conn %q, want direct on loopback", m.ID, m.Conn)
		}
		if m.Capability.Swarm != "alpha" || m.Capability.Backend == "" {
			t.Errorf("member %s capability %+v", m.ID, m.Capability)
		}
	}
}

func TestMemberLeaves(t *testing.T) {
	a := startHost(t, "s", nil)
	b := startHost(t, "s", []lpeer.AddrInfo{infoOf(a)})
	waitFor(t, 20*time.Second, "a lists b", func() error {
		if _, ok := memberSet(a)[b.ID()]; !ok {
			return errors.New("missing")
		}
		return nil
	})
	b.Close()
	waitFor(t, 20*time.Second, "a drops b", func() error {
		if _, ok := memberSet(a)[b.ID()]; ok {
			return errors.New("still listed")
		}
		return nil
	})
}

func TestIdentityFile(t *testing.T) {
	dir := t.TempDir()
	k1, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key written with mode %04o", fi.Mode().Perm())
	}
	k2, err := LoadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Equals(k2) {
		t.Fatal("reloaded key differs")
	}
	if _, err := CreateIdentity(dir); err == nil {
		t.Fatal("CreateIdentity overwrote an existing key")
	}
	os.Chmod(filepath.Join(dir, IdentityFile), 0o644)
	if _, err := LoadIdentity(dir); !errors.Is(err, ErrInsecureKey) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key: got %v", err)
	}
	os.WriteFile(filepath.Join(t.TempDir(), "x"), nil, 0o600)
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, IdentityFile), []byte("not a key"), 0o600)
	if _, err := LoadIdentity(bad); err == nil {
		t.Fatal("garbage key accepted")
	}
}

func TestDataDirLock(t *testing.T) {
	dir := t.TempDir()
	a, err := New(context.Background(), WithDataDir(dir), WithSwarm("s"), loopback(t))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = New(context.Background(), WithDataDir(dir), WithSwarm("s"), loopback(t))
	if !errors.Is(err, ErrDataDirLocked) {
		t.Fatalf("second node on the same data dir: got %v", err)
	}
	a.Close()
	b, err := New(context.Background(), WithDataDir(dir), WithSwarm("s"), loopback(t))
	if err != nil {
		t.Fatalf("after the first node closed: %v", err)
	}
	if b.ID() != a.ID() {
		t.Fatal("identity not persisted across restarts")
	}
	b.Close()
}

// TestCloneRefused: a second process with a copy of a node's key (another
// data dir) is refused when a shared peer sees the first one live.
func TestCloneRefused(t *testing.T) {
	boot := startHost(t, "s", nil)
	key, _, _ := crypto.GenerateEd25519Key(nil)
	first, err := New(context.Background(), WithIdentity(key), WithSwarm("s"), loopback(t), WithBootstrap(infoOf(boot)))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = New(context.Background(), WithIdentity(key), WithSwarm("s"), loopback(t), WithBootstrap(infoOf(boot)))
	if !errors.Is(err, ErrClone) {
		t.Fatalf("clone started: got %v", err)
	}
}

func TestBootstrapUnreachable(t *testing.T) {
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	dead := lpeer.AddrInfo{ID: id, Addrs: []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/1")}}
	k2, _, _ := crypto.GenerateEd25519Key(nil)
	_, err := New(context.Background(), WithIdentity(k2), WithSwarm("s"), loopback(t), WithBootstrap(dead), WithBootstrapTimeout(2*time.Second))
	if !errors.Is(err, ErrBootstrapUnreachable) {
		t.Fatalf("got %v", err)
	}
}

func TestPortInUse(t *testing.T) {
	a := startHost(t, "s", nil)
	addr := a.Libp2p().Addrs()[0]
	key, _, _ := crypto.GenerateEd25519Key(nil)
	_, err := New(context.Background(), WithIdentity(key), WithSwarm("s"), WithListen(addr))
	if !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("got %v", err)
	}
}

func TestParseAddrs(t *testing.T) {
	if _, err := ParseListen([]string{"/ip4/1.2.3.4/tcp/x"}); err == nil || !strings.Contains(err.Error(), "invalid listen address") {
		t.Fatalf("got %v", err)
	}
	if _, err := ParseBootstrap([]string{"/ip4/1.2.3.4/tcp/1"}); err == nil || !strings.Contains(err.Error(), "/p2p/") {
		t.Fatalf("got %v", err)
	}
	got, err := ParseListen([]string{"/ip4/0.0.0.0/tcp/1,/ip4/0.0.0.0/udp/1/quic-v1"})
	if err != nil || len(got) != 2 {
		t.Fatalf("got %v %v", got, err)
	}
}

func TestCapabilitySignature(t *testing.T) {
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	c := Capability{PeerID: id.String(), Swarm: "s", Backend: "cpu", Reachability: "unknown", Seq: 1}
	sealed, err := SealCapability(c, key)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenCapability(sealed)
	if err != nil || got.PeerID != c.PeerID {
		t.Fatalf("open: %v %+v", err, got)
	}
	// A record claiming to be another peer is refused.
	other, _, _ := crypto.GenerateEd25519Key(nil)
	forged, _ := SealCapability(c, other)
	if _, err := OpenCapability(forged); err == nil {
		t.Fatal("record signed by another key accepted")
	}
	// A flipped byte breaks the signature.
	bad := append([]byte(nil), sealed...)
	bad[len(bad)/2] ^= 1
	if _, err := OpenCapability(bad); err == nil {
		t.Fatal("tampered record accepted")
	}
}

func FuzzOpenCapability(f *testing.F) {
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	sealed, _ := SealCapability(Capability{PeerID: id.String(), Swarm: "s", Backend: "cpu", Reachability: "public"}, key)
	f.Add(sealed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := OpenCapability(b)
		if err == nil && c.Validate() != nil {
			t.Fatalf("accepted an invalid record: %+v", c)
		}
	})
}

// FuzzReadFrame feeds the capability stream's framing (msgio's uvarint
// reader, bounded as FetchCapability bounds it) hostile bytes: it must never
// hand back more than the bound.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{3, 'a', 'b', 'c'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := msgio.NewVarintReaderSize(strings.NewReader(string(b)), 64).ReadMsg()
		if err != nil {
			return
		}
		if len(got) > 64 {
			t.Fatalf("frame of %d bytes accepted", len(got))
		}
		// The wire format is a minimal uvarint length, then the bytes.
		if want := append(binary.AppendUvarint(nil, uint64(len(got))), got...); !bytes.HasPrefix(b, want) {
			t.Fatalf("read %x from %x", got, b)
		}
	})
}
