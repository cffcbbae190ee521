package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// CapabilityProtocol serves a node's sealed capability record: the
// responder writes one uvarint-length-prefixed envelope and closes.
const CapabilityProtocol protocol.ID = "/holopeer/capability/1.0.0"

const streamTimeout = 10 * time.Second

// capabilityRefresh is how old a member's record may grow before
// rendezvous fetches it again.
const capabilityRefresh = time.Minute

func (n *Host) serveCapability(s network.Stream) {
	_ = s.Scope().SetService("holopeer.capability")
	_ = s.SetDeadline(time.Now().Add(streamTimeout))
	_, sealed := n.Capability()
	if err := msgio.NewVarintWriter(s).WriteMsg(sealed); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// FetchCapability asks p for its signed capability record and verifies it.
func (n *Host) FetchCapability(ctx context.Context, p lpeer.ID) (Capability, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, streamTimeout)
	defer cancel()
	s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, "capability"), p, CapabilityProtocol)
	if err != nil {
		return Capability{}, nil, fmt.Errorf("capability of %s: %w", p, err)
	}
	_ = s.SetDeadline(time.Now().Add(streamTimeout))
	b, err := msgio.NewVarintReaderSize(s, MaxCapabilityBytes).ReadMsg()
	if err != nil {
		s.Reset()
		return Capability{}, nil, fmt.Errorf("capability of %s: %w", p, err)
	}
	s.Close()
	c, err := OpenCapability(b)
	if err != nil {
		return Capability{}, nil, err
	}
	if c.PeerID != p.String() {
		return Capability{}, nil, fmt.Errorf("capability of %s describes %s", p, c.PeerID)
	}
	return c, b, nil
}

func (n *Host) fetchCapabilityAsync(p lpeer.ID) {
	n.mu.Lock()
	if n.closed || n.fetches[p] {
		n.mu.Unlock()
		return
	}
	n.fetches[p] = true
	n.wg.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.wg.Done()
		defer func() {
			n.mu.Lock()
			delete(n.fetches, p)
			n.mu.Unlock()
		}()
		c, sealed, err := n.FetchCapability(n.ctx, p)
		if err != nil {
			n.log.Debug("capability fetch failed", "peer", p, "err", err)
			return
		}
		if c.Swarm != n.cfg.swarm {
			return // a holopeer node of another swarm sharing the DHT
		}
		if err := n.storeMember(c, sealed); err != nil {
			n.log.Debug("capability refused", "peer", p, "err", err)
		}
	}()
}

// RendezvousKey is the DHT namespace members of a swarm advertise under.
func RendezvousKey(swarm string) string { return "/holopeer/swarm/" + swarm }

// rendezvousLoop advertises the node under the swarm's key and connects to
// the other members it finds. Early rounds come quickly so a new swarm
// forms in seconds; later ones settle at the configured interval.
func (n *Host) rendezvousLoop() {
	defer n.wg.Done()
	delay := 250 * time.Millisecond
	for {
		n.rendezvousRound()
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, n.cfg.rendezvous)
	}
}

func (n *Host) rendezvousRound() {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.rendezvous)
	defer cancel()
	key := RendezvousKey(n.cfg.swarm)
	if _, err := n.disc.Advertise(ctx, key); err != nil {
		n.log.Debug("rendezvous advertise failed", "err", err)
	}
	found, err := n.disc.FindPeers(ctx, key)
	if err != nil {
		n.log.Debug("rendezvous lookup failed", "err", err)
		return
	}
	for ai := range found {
		if ai.ID == n.h.ID() || ai.ID == "" {
			continue
		}
		if len(ai.Addrs) > 0 {
			// Fresh addresses matter: a NATed member's relay address
			// appears only after its reservation.
			n.h.Peerstore().AddAddrs(ai.ID, ai.Addrs, time.Hour)
		}
		if c := n.h.Network().Connectedness(ai.ID); c != network.Connected && c != network.Limited {
			if !n.relayDialReady() && !directDialable(n.h.Peerstore().Addrs(ai.ID)) {
				// Reachable only through a relay, and we cannot hole-punch
				// yet: a relayed connection opened now would never be
				// upgraded (see direct.go). Next round.
				continue
			}
			// A relayed connection is enough to meet: the NATed side then
			// hole-punches it into a direct one (DCUtR), so dialing again
			// for a direct path here would only wait on unreachable
			// private addresses.
			dctx, dcancel := context.WithTimeout(network.WithAllowLimitedConn(ctx, "rendezvous"), n.cfg.dialTO)
			err := n.h.Connect(dctx, lpeer.AddrInfo{ID: ai.ID})
			dcancel()
			if err != nil {
				n.log.Debug("cannot reach swarm member", "peer", ai.ID, "err", err)
				continue
			}
		}
		n.mu.Lock()
		m, known := n.members[ai.ID]
		stale := known && time.Since(m.fetched) > capabilityRefresh
		n.mu.Unlock()
		if !known || stale {
			// Records change (reachability, relayed, NAT mapping); a
			// periodic re-fetch keeps the planner's view honest until
			// gossip carries them.
			n.fetchCapabilityAsync(ai.ID)
		}
	}
	n.pruneMembers(10 * time.Minute)
}

// pruneMembers forgets members that have been disconnected for longer than
// keep, so the table does not grow without bound in a churning swarm.
func (n *Host) pruneMembers(keep time.Duration) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, m := range n.members {
		if n.h.Network().Connectedness(id) == network.Connected || n.h.Network().Connectedness(id) == network.Limited {
			m.LastSeen = now
			continue
		}
		if now.Sub(m.LastSeen) > keep {
			delete(n.members, id)
		}
	}
}

func isPublicAddr(a ma.Multiaddr) bool { return manet.IsPublicAddr(a) }
