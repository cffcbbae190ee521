package peer

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	lpeer "github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// ErrAddrInUse is returned when a listen address is taken.
var ErrAddrInUse = errors.New("address already in use")

// ParseListen parses listen multiaddrs given on the command line.
func ParseListen(ss []string) ([]ma.Multiaddr, error) {
	var out []ma.Multiaddr
	for _, s := range splitList(ss) {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("invalid listen address %q: %v; use a multiaddr such as /ip4/0.0.0.0/tcp/7600 or /ip4/0.0.0.0/udp/7600/quic-v1", s, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// ParseBootstrap parses bootstrap multiaddrs, each ending in /p2p/ID, and
// merges addresses of the same peer.
func ParseBootstrap(ss []string) ([]lpeer.AddrInfo, error) {
	return parsePeerAddrs("bootstrap", ss)
}

// ParseRelayAddrs parses static relay multiaddrs (--relay-addr), each
// ending in /p2p/ID.
func ParseRelayAddrs(ss []string) ([]lpeer.AddrInfo, error) {
	return parsePeerAddrs("relay", ss)
}

func parsePeerAddrs(what string, ss []string) ([]lpeer.AddrInfo, error) {
	var addrs []ma.Multiaddr
	for _, s := range splitList(ss) {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("invalid %s address %q: %v; use the address another node printed, such as /ip4/1.2.3.4/tcp/7600/p2p/12D3Koo…", what, s, err)
		}
		if _, err := a.ValueForProtocol(ma.P_P2P); err != nil {
			return nil, fmt.Errorf("%s address %q has no /p2p/<peer-id> part; copy the full address another node printed", what, s)
		}
		addrs = append(addrs, a)
	}
	infos, err := lpeer.AddrInfosFromP2pAddrs(addrs...)
	if err != nil {
		return nil, fmt.Errorf("invalid %s address: %w", what, err)
	}
	return infos, nil
}

// ParseAnnounce parses addresses to announce (--announce): an IP or DNS
// address with a TCP or UDP port, without /p2p/.
func ParseAnnounce(ss []string) ([]ma.Multiaddr, error) {
	var out []ma.Multiaddr
	for _, s := range splitList(ss) {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("invalid announce address %q: %v; use a multiaddr such as /ip4/203.0.113.7/tcp/7600", s, err)
		}
		if _, err := a.ValueForProtocol(ma.P_P2P); err == nil {
			return nil, fmt.Errorf("announce address %q must not carry /p2p/: the node adds its own id", s)
		}
		if _, _, _, ok := endpoint(a); !ok && !hasDNS(a) {
			return nil, fmt.Errorf("announce address %q needs an IP (or DNS name) and a TCP or UDP port, such as /ip4/203.0.113.7/tcp/7600", s)
		}
		out = append(out, a)
	}
	return out, nil
}

func hasDNS(a ma.Multiaddr) bool {
	if len(a) == 0 {
		return false
	}
	switch a[0].Protocol().Code {
	case ma.P_DNS, ma.P_DNS4, ma.P_DNS6:
		return true
	}
	return false
}

// PortBaseListen returns the listen addresses for --port-base: TCP and
// QUIC (UDP) on the same port of every IPv4 interface, for operators who
// forward that one port number by hand.
func PortBaseListen(base int) ([]ma.Multiaddr, error) {
	if base < 1 || base > 65534 {
		return nil, fmt.Errorf("port base %d: use 1 to 65534 (the control API may take base+1)", base)
	}
	return []ma.Multiaddr{
		ma.StringCast(fmt.Sprintf("/ip4/0.0.0.0/tcp/%d", base)),
		ma.StringCast(fmt.Sprintf("/ip4/0.0.0.0/udp/%d/quic-v1", base)),
	}, nil
}

func splitList(ss []string) []string {
	var out []string
	for _, s := range ss {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// listenError turns libp2p's listen failure into one line that says what
// to do.
func listenError(err error) error {
	if errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use") {
		return fmt.Errorf("%w: %v; another program holds that port: pick another with --listen (or --port-base), or stop the other program", ErrAddrInUse, lastLine(err))
	}
	return fmt.Errorf("start libp2p host: %w", err)
}

func lastLine(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "listen "); i >= 0 {
		return s[i:]
	}
	return s
}

// checkPortsFree binds each fixed listen port once without SO_REUSEPORT.
// libp2p binds with SO_REUSEPORT (it dials out from its listen port for
// hole punching), so without this check a second node on the same port
// would silently share it with the first instead of failing.
func checkPortsFree(addrs []ma.Multiaddr) error {
	for _, a := range addrs {
		network, hostport, err := manet.DialArgs(a)
		if err != nil {
			continue // not an IP transport address; libp2p will judge it
		}
		if strings.HasSuffix(hostport, ":0") {
			continue
		}
		switch {
		case strings.HasPrefix(network, "tcp"):
			l, err := net.Listen(network, hostport)
			if err != nil {
				return listenError(fmt.Errorf("listen %s: %w", a, err))
			}
			l.Close()
		case strings.HasPrefix(network, "udp"):
			c, err := net.ListenPacket(network, hostport)
			if err != nil {
				return listenError(fmt.Errorf("listen %s: %w", a, err))
			}
			c.Close()
		}
	}
	return nil
}
