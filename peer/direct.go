package peer

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
)

// DCUtR hole-punches only when a relayed connection opens, and only if
// both ends already speak /libp2p/dcutr, which go-libp2p registers once a
// peer has observed one of our public addresses. A relayed connection that
// opened a moment too early is never upgraded. Two rules close that gap:
//
//   - A private node does not dial a peer it can only reach through a
//     relay until it speaks /libp2p/dcutr itself (relayDialReady).
//   - The direct-path keeper re-opens relayed connections, so that the
//     other side (the receiver of a relayed connection starts DCUtR)
//     punches again. It does so at once for a connection that opened
//     before this node spoke /libp2p/dcutr and saw no hole punch: nobody
//     will punch it. It does so after keeperFirst, backing off to
//     keeperMax, for one that stayed relayed after a hole punch or
//     without one; then only the peer with the lower peer ID re-opens, so
//     two peers never race. Between two symmetric NATs it retries only
//     every keeperMax. A connection carrying streams is left alone.

const (
	keeperTick  = time.Second
	keeperFirst = 8 * time.Second // let DCUtR's own first round finish
	keeperMax   = 10 * time.Minute
)

// keeperState is the keeper's record of one relayed peer. Wholly owned by
// the keeper goroutine.
type keeperState struct {
	since   time.Time // first seen relayed-only
	nextTry time.Time
	tries   int
}

// relayDialReady reports whether we may dial peers through a relay: we
// punch holes already, or we are not private (then we need no punching).
func (n *Host) relayDialReady() bool {
	return n.reachability() != network.ReachabilityPrivate || n.speaksDCUtR()
}

func (n *Host) speaksDCUtR() bool {
	return slices.Contains(n.h.Mux().Protocols(), holepunch.Protocol)
}

// directDialable reports whether addrs hold a public address that is not
// a relay circuit.
func directDialable(addrs []ma.Multiaddr) bool {
	for _, a := range addrs {
		if !isRelayAddr(a) && isPublicAddr(a) {
			return true
		}
	}
	return false
}

func (n *Host) directPathKeeper() {
	defer n.wg.Done()
	state := map[lpeer.ID]*keeperState{}
	t := time.NewTicker(keeperTick)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case now := <-t.C:
			n.keepDirect(now, state)
		}
	}
}

func (n *Host) keepDirect(now time.Time, state map[lpeer.ID]*keeperState) {
	relayed := map[lpeer.ID]bool{}
	for _, p := range n.h.Network().Peers() {
		if n.h.Network().Connectedness(p) == network.Limited {
			relayed[p] = true
		}
	}
	for p := range state {
		if !relayed[p] {
			delete(state, p)
		}
	}
	if !n.speaksDCUtR() {
		return
	}
	for p := range relayed {
		st := state[p]
		if st == nil {
			st = &keeperState{since: now, nextTry: now.Add(keeperFirst)}
			state[p] = st
		}
		if n.openedBeforeDCUtR(p) && !n.nat.punchSeen(p) {
			st.tries++
			n.reopenRelayed(p, st.tries, "it opened before this node could hole-punch")
			continue
		}
		if now.Before(st.nextTry) || bytes.Compare([]byte(n.h.ID()), []byte(p)) > 0 || n.nat.punchBusy(p, now) {
			continue
		}
		if st.tries > 0 && n.bothSymmetric(p) {
			// Punching failed and cannot work; look again only rarely,
			// in case a NAT changed.
			st.nextTry = now.Add(keeperMax)
			continue
		}
		st.tries++
		st.nextTry = now.Add(min(keeperFirst<<st.tries, keeperMax))
		n.reopenRelayed(p, st.tries, "it stayed relayed")
	}
}

// openedBeforeDCUtR reports whether a relayed connection to p opened
// before we registered /libp2p/dcutr, so that no hole punch started on it.
func (n *Host) openedBeforeDCUtR(p lpeer.ID) bool {
	ready := n.dcutrAt.Load()
	if ready == 0 {
		return false
	}
	for _, c := range n.h.Network().ConnsToPeer(p) {
		if c.Stat().Limited && c.Stat().Opened.UnixNano() < ready {
			return true
		}
	}
	return false
}

// reopenRelayed closes our idle relayed connections to p and dials it
// through a relay again, so p sees a fresh inbound relayed connection and
// starts a hole punch.
func (n *Host) reopenRelayed(p lpeer.ID, try int, why string) {
	conns := n.h.Network().ConnsToPeer(p)
	for _, c := range conns {
		if !c.Stat().Limited || len(c.GetStreams()) > 0 {
			return // direct already, or busy: leave it be
		}
	}
	n.nat.log.Info("re-opening a relayed connection so the peer hole-punches it", "peer", p, "because", why, "try", try, "last", n.nat.lastPunchError(p))
	for _, c := range conns {
		c.Close()
	}
	ctx, cancel := context.WithTimeout(network.WithAllowLimitedConn(n.ctx, "re-open for hole punch"), n.cfg.dialTO)
	defer cancel()
	if err := n.h.Connect(ctx, lpeer.AddrInfo{ID: p}); err != nil {
		n.nat.log.Info("cannot re-open relayed connection", "peer", p, "err", err)
	}
}

// punchBusy reports whether a hole punch with p runs or ran moments ago
// (DCUtR pauses briefly between its attempts).
func (s *natState) punchBusy(p lpeer.ID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := s.punches[p]
	return sum != nil && (sum.active || now.Sub(sum.lastAt) < keeperFirst)
}

// punchSeen reports whether any hole punch with p was recorded.
func (s *natState) punchSeen(p lpeer.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.punches[p] != nil
}

func (s *natState) lastPunchError(p lpeer.ID) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sum := s.punches[p]; sum != nil {
		return sum.lastErr
	}
	return "none attempted"
}

// bothSymmetric reports whether our NAT and p's (from its record) both
// map each destination to a new port: no hole punch can connect them.
func (n *Host) bothSymmetric(p lpeer.ID) bool {
	n.mu.Lock()
	m, ok := n.members[p]
	theirs := ""
	if ok {
		theirs = m.Capability.NATMapping
	}
	n.mu.Unlock()
	return theirs == string(MappingDependent) && overallMapping(n.ownMapping()) == MappingDependent
}
