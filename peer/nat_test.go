package peer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func mas(ss ...string) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, s := range ss {
		out = append(out, ma.StringCast(s))
	}
	return out
}

func obs(local, observer, observed string) observation {
	return observation{Local: ma.StringCast(local), Observer: ma.StringCast(observer), Observed: ma.StringCast(observed), At: time.Now()}
}

func TestDecideReachability(t *testing.T) {
	home := mas("/ip4/10.0.1.2/tcp/4001", "/ip4/127.0.0.1/tcp/4001")
	natSeen := []observation{obs("/ip4/10.0.1.2/tcp/4001", "/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.11/tcp/4001")}
	cases := []struct {
		name string
		e    reachEvidence
		want network.Reachability
		why  string
	}{
		{"loopback testnet", reachEvidence{Own: mas("/ip4/127.0.0.1/tcp/1")}, network.ReachabilityUnknown, "no NAT"},
		{"LAN peers only", reachEvidence{Own: home, Observed: []observation{obs("/ip4/10.0.1.2/tcp/4001", "/ip4/10.0.1.3/tcp/4001", "/ip4/10.0.1.2/tcp/4001")}}, network.ReachabilityUnknown, "no NAT"},
		{"public interface", reachEvidence{Own: mas("/ip4/7.7.7.1/tcp/4001"), PublicPeers: true}, network.ReachabilityPublic, "listening on public"},
		{"home node at start-up", reachEvidence{Own: home, PublicPeers: true}, network.ReachabilityPrivate, "no public address"},
		{"home node observed", reachEvidence{Own: home, Observed: natSeen, PublicPeers: true}, network.ReachabilityPrivate, "7.7.7.11"},
		{"observed at own IP is no NAT", reachEvidence{Own: mas("/ip4/7.7.7.1/tcp/4001"), Observed: []observation{obs("/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.2/tcp/1", "/ip4/7.7.7.1/tcp/4001")}}, network.ReachabilityPublic, "listening"},
		{"forced", reachEvidence{Forced: network.ReachabilityPrivate, Own: mas("/ip4/7.7.7.1/tcp/4001")}, network.ReachabilityPrivate, "operator"},
		{"autonat v2 reachable beats NAT evidence", reachEvidence{Own: home, Observed: natSeen, Reachable: mas("/ip4/7.7.7.11/tcp/4001")}, network.ReachabilityPublic, "AutoNAT v2"},
		{"firewalled public IP", reachEvidence{Own: mas("/ip4/7.7.7.1/tcp/4001"), Unreachable: mas("/ip4/7.7.7.1/tcp/4001")}, network.ReachabilityPrivate, "unreachable"},
		{"announced beats unreachable", reachEvidence{Own: home, Announced: mas("/ip4/7.7.7.11/tcp/4001"), Unreachable: mas("/ip4/7.7.7.11/tcp/51000")}, network.ReachabilityPublic, "announced"},
		{"announced private address is no evidence", reachEvidence{Own: home, Announced: mas("/ip4/192.168.1.2/tcp/4001"), PublicPeers: true}, network.ReachabilityPrivate, "no public"},
		{"port mapped", reachEvidence{Own: home, Mapped: mas("/ip4/7.7.7.11/tcp/4001"), Observed: natSeen}, network.ReachabilityPublic, "mapped"},
		{"CGNAT mapping is not public", reachEvidence{Own: home, Mapped: mas("/ip4/100.64.0.7/tcp/4001"), Observed: natSeen}, network.ReachabilityPrivate, "behind NAT"},
		{"documentation range is not public", reachEvidence{Own: mas("/ip4/203.0.113.5/tcp/1")}, network.ReachabilityUnknown, "no NAT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := decideReachability(tc.e)
			if v.Reachability != tc.want || !strings.Contains(v.Reason, tc.why) {
				t.Fatalf("got %v, want %s with reason containing %q", v, reachString(tc.want), tc.why)
			}
		})
	}
}

func TestClassifyMapping(t *testing.T) {
	const local, localQ = "/ip4/10.0.3.2/tcp/4001", "/ip4/10.0.3.2/udp/4001/quic-v1"
	cases := []struct {
		name string
		obs  []observation
		want map[string]NATMapping
	}{
		{"one observer", []observation{obs(local, "/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.13/tcp/4001")}, map[string]NATMapping{"tcp": MappingUnknown}},
		{"same port for two destinations", []observation{
			obs(local, "/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.13/tcp/4001"),
			obs(local, "/ip4/7.7.7.2/tcp/4001", "/ip4/7.7.7.13/tcp/4001"),
		}, map[string]NATMapping{"tcp": MappingIndependent}},
		{"new port per destination", []observation{
			obs(localQ, "/ip4/7.7.7.1/udp/4001/quic-v1", "/ip4/7.7.7.13/udp/40123/quic-v1"),
			obs(localQ, "/ip4/7.7.7.2/udp/4001/quic-v1", "/ip4/7.7.7.13/udp/51234/quic-v1"),
			obs(local, "/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.13/tcp/4001"),
		}, map[string]NATMapping{"udp": MappingDependent, "tcp": MappingUnknown}},
		{"same observer twice is one observer", []observation{
			obs(local, "/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.13/tcp/4001"),
			obs(local, "/ip4/7.7.7.1/tcp/4001", "/ip4/7.7.7.13/tcp/5000"),
		}, map[string]NATMapping{"tcp": MappingUnknown}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := classifyMapping(tc.obs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
	if overallMapping(map[string]NATMapping{"tcp": MappingDependent, "udp": MappingIndependent}) != MappingIndependent {
		t.Fatal("one punchable transport should make the NAT punchable")
	}
}

func TestCompactDialError(t *testing.T) {
	got := compactDialError("failed to dial: failed to dial 12D3KooWJGHn: all dials failed\n  * [/ip4/127.0.0.1/tcp/4001] dial to self attempted\n  * [/ip4/7.7.7.13/tcp/15901] dial tcp4 0.0.0.0:4001->7.7.7.13:15901: i/o timeout\n  * [/ip4/10.0.3.2/udp/4001/quic-v1] context deadline exceeded")
	if want := "all dials failed (3 addresses; public: /ip4/7.7.7.13/tcp/15901 i/o timeout)"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := compactDialError("failed to dial:\ncontext canceled"); got != "failed to dial: context canceled" {
		t.Fatalf("got %q", got)
	}
}

func TestNATOptionsValidate(t *testing.T) {
	if _, err := ParseReachability("sometimes"); err == nil {
		t.Fatal("bad reachability accepted")
	}
	if _, err := ParseAnnounce([]string{"/ip4/7.7.7.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"}); err == nil {
		t.Fatal("announce with /p2p/ accepted")
	}
	if _, err := ParseAnnounce([]string{"/ip4/7.7.7.1"}); err == nil {
		t.Fatal("announce without a port accepted")
	}
	if got, err := ParseAnnounce([]string{"/ip4/7.7.7.1/tcp/7600,/dns4/node.example.org/udp/7600/quic-v1"}); err != nil || len(got) != 2 {
		t.Fatalf("announce: %v %v", got, err)
	}
	if _, err := ParseRelayAddrs([]string{"/ip4/7.7.7.1/tcp/1"}); err == nil || !strings.Contains(err.Error(), "relay address") {
		t.Fatalf("relay without id: %v", err)
	}
	if _, err := PortBaseListen(0); err == nil {
		t.Fatal("port base 0 accepted")
	}
	if l, err := PortBaseListen(4001); err != nil || len(l) != 2 || l[1].String() != "/ip4/0.0.0.0/udp/4001/quic-v1" {
		t.Fatalf("port base: %v %v", l, err)
	}
	if err := WithRelayLimit(time.Second, 10)(&config{set: map[string]bool{}}); err == nil {
		t.Fatal("a relay limit too small for hole punching accepted")
	}
}

// TestLoopbackStaysUnknown: nodes on loopback see no NAT, stay "unknown",
// serve the DHT and run no relay service, so loopback swarms keep working.
func TestLoopbackStaysUnknown(t *testing.T) {
	a := startHost(t, "s", nil)
	b := startHost(t, "s", []lpeer.AddrInfo{infoOf(a)})
	for _, h := range []*Host{a, b} {
		info := h.NAT()
		if info.Reachability != "unknown" || info.DHTMode != "server" || info.RelayService.Enabled {
			t.Fatalf("loopback node: %+v", info)
		}
	}
}

// TestForcedReachability: a forced-private node is a DHT client from the
// start; a forced-public one serves the DHT and runs the relay service,
// unless it refuses to relay.
func TestForcedReachability(t *testing.T) {
	pub := startHost(t, "s", nil, WithReachability(ReachabilityPublic))
	priv := startHost(t, "s", []lpeer.AddrInfo{infoOf(pub)}, WithReachability(ReachabilityPrivate))
	refuser := startHost(t, "s", nil, WithReachability(ReachabilityPublic), WithRelayService(false))
	if m := priv.DHTMode(); m != "client" {
		t.Fatalf("private node DHT mode %s", m)
	}
	waitFor(t, 5*time.Second, "public node serves DHT and relays", func() error {
		info := pub.NAT()
		if info.DHTMode != "server" || !info.RelayService.Enabled {
			return errors.New(info.DHTMode)
		}
		return nil
	})
	if info := refuser.NAT(); info.RelayService.Enabled || !info.RelayService.Refused {
		t.Fatalf("--relay=false node relays: %+v", info.RelayService)
	}
	if c, _ := priv.Capability(); c.Reachability != "private" || c.NATMapping != string(MappingUnknown) {
		t.Fatalf("private capability %+v", c)
	}
	for _, p := range pub.NAT().DHTPeers {
		if p == priv.ID() {
			t.Fatal("a private node is in the public node's DHT routing table")
		}
	}
}

// TestProbeLoopback: a 4 MiB probe arrives intact over a direct
// connection; an oversized header is refused before any payload is read.
func TestProbeLoopback(t *testing.T) {
	a := startHost(t, "s", nil)
	b := startHost(t, "s", []lpeer.AddrInfo{infoOf(a)})
	res, err := b.Probe(context.Background(), a.ID(), ProbeOptions{Bytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.Conn != ConnDirect || res.Bytes != 4<<20 || len(res.SHA256) != 64 {
		t.Fatalf("probe result %+v", res)
	}
	if _, err := b.Probe(context.Background(), a.ID(), ProbeOptions{Bytes: MaxProbeBytes + 1}); err == nil {
		t.Fatal("oversized probe accepted")
	}
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], MaxProbeBytes+1)
	if _, err := readProbeHeader(bytes.NewReader(hdr[:])); err == nil {
		t.Fatal("oversized header accepted")
	}
}

func FuzzProbeDecoders(f *testing.F) {
	f.Add(make([]byte, probeReplyLen))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 0, 0x40, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := readProbeHeader(bytes.NewReader(b)); err == nil && (n < 0 || n > MaxProbeBytes) {
			t.Fatalf("header accepted %d", n)
		}
		if n, _, err := readProbeReply(bytes.NewReader(b)); err == nil && (n < 0 || n > MaxProbeBytes) {
			t.Fatalf("reply accepted %d", n)
		}
	})
}
