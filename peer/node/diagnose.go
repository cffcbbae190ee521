package node

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip"
)

// Why a node follows no coordinator, for callers that must tell the causes
// apart (errors.Is on what Diagnose returns).
var (
	// ErrNoMembers: no other member of this node's swarm is in sight.
	ErrNoMembers = errors.New("no other member of the swarm found")
	// ErrNoCandidate: members, but none of them can stand as coordinator.
	ErrNoCandidate = errors.New("no member can stand as coordinator")
	// ErrCandidateRefused: candidates, but this node's policy refuses
	// their evidence.
	ErrCandidateRefused = errors.New("this node refuses the candidates' evidence")
)

// Diagnose says why this node follows no coordinator yet: nil while it
// follows one or while nothing is known to be wrong (an election can take
// a few seconds), else an error wrapping one of ErrNoMembers,
// ErrNoCandidate or ErrCandidateRefused that says what to do.
func (n *Node) Diagnose() error {
	if n.gossip.Coordinator() != nil {
		return nil
	}
	swarm := n.cfg.Swarm
	self := n.host.ID()
	caps := map[lpeer.ID]string{} // member -> its TEE, "" when it cannot stand
	for _, m := range n.host.Members() {
		caps[m.ID] = teeOf(m.Capability.CanAttest, m.Capability.TEE)
	}
	for id, p := range n.gossip.Presence() {
		if id != self && p.Capability.Swarm == swarm {
			caps[id] = teeOf(p.Capability.CanAttest, p.Capability.TEE)
		}
	}
	delete(caps, self)
	if len(caps) == 0 {
		conns := len(n.host.Libp2p().Network().Peers())
		if conns > 0 {
			return fmt.Errorf("%w: connected to %d peer(s), but none is a member of swarm %q; were the nodes started with another --swarm? pass theirs", ErrNoMembers, conns, swarm)
		}
		return fmt.Errorf("%w: connected to no peer; check --bootstrap (the address a node of swarm %q prints, with /p2p/ID)", ErrNoMembers, swarm)
	}
	var sim, other []string
	for id, tee := range caps {
		switch tee {
		case "":
		case "sim":
			sim = append(sim, id.String())
		default:
			other = append(other, id.String())
		}
	}
	if len(sim)+len(other) == 0 {
		return fmt.Errorf("%w: %d member(s) of swarm %q, all started with --tee none (they vote and compute but never stand); start one with --tee snp|tdx in a confidential VM, or on a testnet with --tee sim --allow-sim", ErrNoCandidate, len(caps), swarm)
	}
	if len(other) == 0 && !n.cfg.AllowSim {
		sort.Strings(sim)
		return fmt.Errorf("%w: the only candidate(s), %s, attest with sim (INSECURE), which this node refuses; on a testnet that opted into sim, pass --allow-sim", ErrCandidateRefused, strings.Join(sim, ", "))
	}
	rej := n.gossip.Stats().Rejections
	if bad := rej[gossip.ReasonEvidence]; bad > 0 {
		return fmt.Errorf("%w: %d election message(s) refused for their evidence (--tee-policy %q; the WARN lines name the candidate and why)", ErrCandidateRefused, bad, n.cfg.TEEPolicy)
	}
	return nil
}

func teeOf(canAttest bool, tee string) string {
	if !canAttest || tee == "none" {
		return ""
	}
	return tee
}

// CoordinatorProgress is one line on how the wait for a coordinator goes.
func (n *Node) CoordinatorProgress() string {
	members := len(n.host.Members())
	cands := 0
	for id, p := range n.gossip.Presence() {
		if id != n.host.ID() && teeOf(p.Capability.CanAttest, p.Capability.TEE) != "" {
			cands++
		}
	}
	return fmt.Sprintf("swarm %q: %d member(s), %d candidate(s) to coordinate, %d peer(s) connected, term %d",
		n.cfg.Swarm, members, cands, len(n.host.Libp2p().Network().Peers()), n.gossip.Term())
}
