package election

import "fmt"

// MsgType names a message. The gossip wire encodes it as a type byte.
type MsgType uint8

// Message types. Only append.
const (
	MsgCandidacy MsgType = 1 // a candidate opens Term
	MsgHeartbeat MsgType = 2 // the coordinator of Term renews its lease
	MsgVote      MsgType = 3 // From follows Coordinator in Term
)

func (t MsgType) String() string {
	switch t {
	case MsgCandidacy:
		return "candidacy"
	case MsgHeartbeat:
		return "heartbeat"
	case MsgVote:
		return "vote"
	}
	return fmt.Sprintf("msg(%d)", uint8(t))
}

// IsClaim reports whether messages of this type claim a term.
func (t MsgType) IsClaim() bool { return t == MsgCandidacy || t == MsgHeartbeat }

// BeaconSize and SaltSize are the sizes of the random parts of a claim.
const (
	BeaconSize = 32
	SaltSize   = 32
	NonceSize  = 32
)

// Parent is the heartbeat a candidacy descends from: the newest one its
// author had accepted. The zero Parent is a swarm's first election.
type Parent struct {
	Term        uint64
	Coordinator string
	Seq         uint64
	Beacon      [BeaconSize]byte
}

// Message is an election message. From is its author, which the transport
// must authenticate (holopeer: pubsub strict signing).
type Message struct {
	Type MsgType
	From string
	Term uint64
	// Coordinator: for a claim, the claimant (must equal From); for a
	// vote, the coordinator the voter follows.
	Coordinator string

	// Parent, Salt and Evidence are a claim's proof. A vote may carry the
	// proof of Coordinator's claim for Term (it has no Seq, Beacon or
	// LeaseTicks): only a proven vote can make a coordinator open a new
	// term, so a peer without a TEE cannot force churn by voting for a
	// coordinator that never claimed.
	Parent   Parent
	Salt     [SaltSize]byte
	Evidence []byte

	// Claims only.
	Seq        uint64 // 0 for a candidacy, then 1, 2, … per heartbeat
	Beacon     [BeaconSize]byte
	LeaseTicks int // how long this claim may be followed without another
	// Resign marks a coordinator's last heartbeat: it yields its term, and
	// its followers stop following it now rather than a lease later.
	Resign bool
}

func (m Message) String() string {
	if m.Type.IsClaim() {
		return fmt.Sprintf("%s from %s term %d seq %d parent %d/%s/%d", m.Type, short(m.From), m.Term, m.Seq,
			m.Parent.Term, short(m.Parent.Coordinator), m.Parent.Seq)
	}
	return fmt.Sprintf("%s from %s term %d for %s", m.Type, short(m.From), m.Term, short(m.Coordinator))
}

func short(id string) string {
	if len(id) > 12 {
		return id[len(id)-6:]
	}
	return id
}

// ClaimProof is what proves a coordinator's claim for a term: its parent,
// salt and evidence (the nonce is derived from them). A follower repeats
// the proof of the claim it accepted in its votes, and the caller persists
// it with the term (Status.Proof, Config.RestoreProof).
type ClaimProof struct {
	Parent   Parent
	Salt     [SaltSize]byte
	Evidence []byte
}

// Role is what a node is doing now.
type Role uint8

// Roles.
const (
	Follower Role = iota
	Candidate
	Coordinator
)

func (r Role) String() string {
	switch r {
	case Follower:
		return "follower"
	case Candidate:
		return "candidate"
	case Coordinator:
		return "coordinator"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Status is a node's view.
type Status struct {
	Role Role
	// Term is the newest term accepted and Coordinator the peer accepted
	// for it (possibly this node). Both stay set after the lease lapses:
	// they are the fencing floor.
	Term        uint64
	Coordinator string
	// Live says whether Coordinator is followed now (lease not lapsed, or
	// this node is the coordinator).
	Live bool
	// LeaseLeft is the number of ticks until the lease lapses.
	LeaseLeft   int
	Attestation Attestation
	// Proof is the proof of Coordinator's claim for Term, when this node
	// has it (zero after a restore without RestoreProof). It does not
	// count as a change in Ready.StatusChanged: it changes only with Term
	// and Coordinator, or when a coordinator re-attests its term.
	Proof ClaimProof
}

// Following returns the live coordinator, or "" when there is none.
func (s Status) Following() string {
	if !s.Live {
		return ""
	}
	return s.Coordinator
}

// AttestRequest asks the caller to attest claims for Term with Nonce and
// give the answer to Node.Attested.
type AttestRequest struct {
	Term  uint64
	Nonce [NonceSize]byte
}

// Ready is what the caller must do after Step, Tick or Attested.
type Ready struct {
	// Messages to publish on the election topic, in order.
	Messages []Message
	// Attest, when set, asks for evidence; answer with Node.Attested.
	Attest *AttestRequest
	// Status is the node's view; StatusChanged says whether it differs
	// from the previous Ready's (the caller persists Term/Coordinator and
	// tells its watchers).
	Status        Status
	StatusChanged bool
}
