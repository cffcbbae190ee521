package peer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	ma "github.com/multiformats/go-multiaddr"
)

// Option configures a Host. Options return an error for invalid values and
// refuse to be given twice.
type Option func(*config) error

// Offer is what the node lends the swarm; the Host adds the fields it knows
// itself (peer id, swarm, platform, reachability) when it seals a
// Capability.
type Offer struct {
	Backend     string  // cpu | cuda | metal
	CPUs        int     // cores it computes with
	MemoryBytes uint64  // memory it lends to stages
	GFLOPS      float64 // measured GEMM throughput of Backend
	Hours       string  // when it is on offer
	TEE         string  // snp | tdx | sim | none
	CanAttest   bool
	APIAddr     string
}

// DHTMode chooses whether the node serves the swarm's DHT.
type DHTMode int

const (
	// DHTAuto serves the DHT unless the node is known to be private or
	// relayed: a NATed node cannot answer queries others route to it.
	DHTAuto DHTMode = iota
	DHTServer
	DHTClient
)

type config struct {
	key        crypto.PrivKey
	dataDir    string
	swarm      string
	listen     []ma.Multiaddr
	bootstrap  []lpeer.AddrInfo
	log        *slog.Logger
	offer      *Offer
	dhtMode    *DHTMode
	connLow    int
	connHigh   int
	maxConns   int
	rendezvous time.Duration
	dialTO     time.Duration
	bootTO     time.Duration
	extra      []libp2p.Option
	set        map[string]bool

	// NAT traversal (see nat.go and reachability.go).
	reachability network.Reachability // forced; Unknown decides from evidence
	relayService bool                 // serve as a relay when public
	relayLimit   relayv2.RelayLimit
	staticRelays []lpeer.AddrInfo
	announce     []ma.Multiaddr
	portMapping  bool
}

func (c *config) once(name string) error {
	if c.set[name] {
		return fmt.Errorf("peer: option %s given twice", name)
	}
	c.set[name] = true
	return nil
}

// WithIdentity sets the identity key directly (tests, keygen). A node
// started by `holopeer up` uses WithDataDir instead.
func WithIdentity(key crypto.PrivKey) Option {
	return func(c *config) error {
		if key == nil {
			return errors.New("peer: nil identity key")
		}
		if err := c.once("identity"); err != nil {
			return err
		}
		c.key = key
		return nil
	}
}

// WithDataDir keeps the node's identity and lock in dir. The identity is
// created on first use; the dir is locked for the life of the Host.
func WithDataDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("peer: empty data dir")
		}
		if err := c.once("data-dir"); err != nil {
			return err
		}
		c.dataDir = dir
		return nil
	}
}

// WithSwarm names the swarm. Nodes meet only members of the same swarm.
func WithSwarm(name string) Option {
	return func(c *config) error {
		if err := ValidateSwarmName(name); err != nil {
			return err
		}
		if err := c.once("swarm"); err != nil {
			return err
		}
		c.swarm = name
		return nil
	}
}

// WithListen sets the listen addresses (default: TCP and QUIC on an
// ephemeral port of every interface).
func WithListen(addrs ...ma.Multiaddr) Option {
	return func(c *config) error {
		if len(addrs) == 0 {
			return errors.New("peer: WithListen needs at least one address")
		}
		if err := c.once("listen"); err != nil {
			return err
		}
		c.listen = addrs
		return nil
	}
}

// WithBootstrap sets the peers to join the swarm through. Each must carry
// a /p2p/ID component.
func WithBootstrap(peers ...lpeer.AddrInfo) Option {
	return func(c *config) error {
		if err := c.once("bootstrap"); err != nil {
			return err
		}
		c.bootstrap = peers
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("peer: nil logger")
		}
		if err := c.once("logger"); err != nil {
			return err
		}
		c.log = l
		return nil
	}
}

// WithOffer sets what the node lends; see Offer.
func WithOffer(o Offer) Option {
	return func(c *config) error {
		if err := c.once("offer"); err != nil {
			return err
		}
		c.offer = &o
		return nil
	}
}

// WithDHTMode forces the DHT mode (default DHTAuto).
func WithDHTMode(m DHTMode) Option {
	return func(c *config) error {
		if err := c.once("dht-mode"); err != nil {
			return err
		}
		c.dhtMode = &m
		return nil
	}
}

// WithConnLimits sets the connection manager's low and high water marks
// and the resource manager's hard cap on connections.
func WithConnLimits(low, high, max int) Option {
	return func(c *config) error {
		if low <= 0 || high < low || max < high {
			return fmt.Errorf("peer: connection limits need 0 < low ≤ high ≤ max, got %d, %d, %d", low, high, max)
		}
		if err := c.once("conn-limits"); err != nil {
			return err
		}
		c.connLow, c.connHigh, c.maxConns = low, high, max
		return nil
	}
}

// WithRendezvousInterval sets how often the node re-advertises itself and
// looks for other members (default 20 s; the first rounds run sooner).
func WithRendezvousInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < 100*time.Millisecond {
			return fmt.Errorf("peer: rendezvous interval %v is too short", d)
		}
		if err := c.once("rendezvous"); err != nil {
			return err
		}
		c.rendezvous = d
		return nil
	}
}

// WithBootstrapTimeout bounds how long New waits to reach a bootstrap peer
// (default 15 s).
func WithBootstrapTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("peer: bootstrap timeout %v", d)
		}
		if err := c.once("bootstrap-timeout"); err != nil {
			return err
		}
		c.bootTO = d
		return nil
	}
}

// Reachability is how the operator sets the node's reachability:
// ReachabilityAuto (decide from evidence, the default), or force public or
// private.
type Reachability string

const (
	ReachabilityAuto    Reachability = "auto"
	ReachabilityPublic  Reachability = "public"
	ReachabilityPrivate Reachability = "private"
)

// ParseReachability accepts auto, public or private.
func ParseReachability(s string) (Reachability, error) {
	switch r := Reachability(s); r {
	case ReachabilityAuto, ReachabilityPublic, ReachabilityPrivate:
		return r, nil
	}
	return "", fmt.Errorf("reachability %q: use auto, public or private", s)
}

// WithReachability forces the node's reachability instead of deciding it
// from what peers and AutoNAT report (default ReachabilityAuto).
func WithReachability(r Reachability) Option {
	return func(c *config) error {
		if _, err := ParseReachability(string(r)); err != nil {
			return fmt.Errorf("peer: %w", err)
		}
		if err := c.once("reachability"); err != nil {
			return err
		}
		switch r {
		case ReachabilityPublic:
			c.reachability = network.ReachabilityPublic
		case ReachabilityPrivate:
			c.reachability = network.ReachabilityPrivate
		}
		return nil
	}
}

// WithRelayService says whether the node serves as a circuit relay for
// NATed peers while it is publicly reachable (default true).
func WithRelayService(enabled bool) Option {
	return func(c *config) error {
		if err := c.once("relay-service"); err != nil {
			return err
		}
		c.relayService = enabled
		return nil
	}
}

// WithRelayLimit bounds each connection the relay service carries: its
// lifetime and the bytes it may carry in each direction (default
// DefaultRelayLimit).
func WithRelayLimit(d time.Duration, bytesPerDirection int64) Option {
	return func(c *config) error {
		if d < time.Second || bytesPerDirection < 64<<10 {
			return fmt.Errorf("peer: relay limit %v / %d bytes is too small for hole punching (need ≥1s and ≥64 KiB)", d, bytesPerDirection)
		}
		if err := c.once("relay-limit"); err != nil {
			return err
		}
		c.relayLimit = relayv2.RelayLimit{Duration: d, Data: bytesPerDirection}
		return nil
	}
}

// WithStaticRelays names relays a private node reserves slots on, ahead
// of those it finds in the swarm. Each must carry a /p2p/ID component.
func WithStaticRelays(relays ...lpeer.AddrInfo) Option {
	return func(c *config) error {
		if err := c.once("static-relays"); err != nil {
			return err
		}
		c.staticRelays = relays
		return nil
	}
}

// WithAnnounce adds fixed addresses the node advertises besides those it
// discovers, for an operator who forwarded a port by hand. A public
// announced address makes the node public (see reachability.go).
func WithAnnounce(addrs ...ma.Multiaddr) Option {
	return func(c *config) error {
		if err := c.once("announce"); err != nil {
			return err
		}
		c.announce = addrs
		return nil
	}
}

// WithPortMapping says whether the node asks its router to forward a port
// by UPnP or NAT-PMP (default true; never when it listens on loopback only).
func WithPortMapping(enabled bool) Option {
	return func(c *config) error {
		if err := c.once("port-mapping"); err != nil {
			return err
		}
		c.portMapping = enabled
		return nil
	}
}

// WithLibp2pOptions appends raw libp2p options. It exists for the NAT
// traversal and test set-ups that need a knob this package does not name.
func WithLibp2pOptions(opts ...libp2p.Option) Option {
	return func(c *config) error {
		c.extra = append(c.extra, opts...)
		return nil
	}
}

// applyDefaults fills what the caller did not set.
func (c *config) applyDefaults() error {
	if c.swarm == "" {
		return errors.New("peer: a swarm name is required (WithSwarm)")
	}
	if c.key == nil && c.dataDir == "" {
		return errors.New("peer: an identity is required (WithDataDir or WithIdentity)")
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.listen == nil {
		for _, s := range []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"} {
			c.listen = append(c.listen, ma.StringCast(s))
		}
	}
	if c.offer == nil {
		c.offer = &Offer{Backend: "cpu", TEE: "none", Hours: "always"}
	}
	if c.dhtMode == nil {
		m := DHTAuto
		c.dhtMode = &m
	}
	if c.connHigh == 0 {
		c.connLow, c.connHigh, c.maxConns = 64, 192, 512
	}
	if c.rendezvous == 0 {
		c.rendezvous = 20 * time.Second
	}
	if c.dialTO == 0 {
		c.dialTO = 10 * time.Second
	}
	if c.bootTO == 0 {
		c.bootTO = 15 * time.Second
	}
	if !c.set["relay-service"] {
		c.relayService = true
	}
	if !c.set["port-mapping"] {
		c.portMapping = true
	}
	if !c.set["relay-limit"] {
		c.relayLimit = DefaultRelayLimit
	}
	return nil
}

// ValidateSwarmName accepts 1–64 characters of [A-Za-z0-9._-].
func ValidateSwarmName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("swarm name %q must be 1 to 64 characters", name)
	}
	for _, r := range name {
		ok := r == '-' || r == '_' || r == '.' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("swarm name %q may only hold letters, digits, '.', '_' and '-'", name)
		}
	}
	return nil
}
