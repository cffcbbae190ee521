package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
	hpeer "github.com/holopeer/holopeer/peer"
)

// Wire format of every gossip message. Each begins with a type byte and a
// version byte; the body layout for (type, version) follows, big-endian,
// fields in the order listed. A decoder checks every length against its
// bound before it slices or allocates, rejects unknown types and versions,
// and rejects trailing bytes.
//
//	0x01 candidacy v1 (election topic), 0x02 heartbeat v1 (same layout):
//	  term u64 | issued_at i64 (unix ms) | lease_ms u32 | seq u64 | flags u8 (bit 0: resign)
//	  coordinator id8 | beacon [32] | salt [32]
//	  parent_term u64 | parent_coordinator id8 | parent_seq u64 | parent_beacon [32]
//	  evidence u32-len bytes (1..MaxEvidenceBytes)
//	0x03 vote v1 (election topic):
//	  term u64 | issued_at i64 | voter id8 | coordinator id8
//	  then, optionally, the proof of coordinator's claim for term:
//	  salt [32] | parent_term u64 | parent_coordinator id8 | parent_seq u64 | parent_beacon [32]
//	  evidence u32-len bytes (1..MaxEvidenceBytes)
//	0x10 presence v1 (presence topic):
//	  issued_at i64 | capability u16-len bytes (1..hpeer.MaxCapabilityBytes; a sealed record)
//	0x20 job v1 (jobs topic):
//	  term u64 | issued_at i64 | payload u32-len bytes (0..MaxJobPayload)
//
// id8 is a peer ID's bytes with a one-byte length (0..MaxPeerIDBytes; 0
// only for a first election's parent).

// MsgType is a gossip message's type byte. Only append.
type MsgType uint8

// Message types.
const (
	TypeCandidacy MsgType = 0x01
	TypeHeartbeat MsgType = 0x02
	TypeVote      MsgType = 0x03
	TypePresence  MsgType = 0x10
	TypeJob       MsgType = 0x20
)

// WireVersion is the only body version this build reads and writes.
// History: 1 — first version.
const WireVersion = 1

// Bounds.
const (
	MaxPeerIDBytes   = 128
	MaxEvidenceBytes = 64 << 10
	MaxJobPayload    = 60 << 10

	claimFixed = 2 + 8 + 8 + 4 + 8 + 1 + 1 + 32 + 32 + 8 + 1 + 8 + 32 + 4
	voteFixed  = 2 + 8 + 8 + 1 + 1 + 32 + 8 + 1 + 8 + 32 + 4 // with a proof
	// MaxElectionBytes bounds a whole election message.
	MaxElectionBytes = max(claimFixed+2*MaxPeerIDBytes, voteFixed+3*MaxPeerIDBytes) + MaxEvidenceBytes
	// MaxPresenceBytes bounds a presence message.
	MaxPresenceBytes = 2 + 8 + 2 + hpeer.MaxCapabilityBytes
	// MaxJobBytes bounds a job message.
	MaxJobBytes = 2 + 8 + 8 + 4 + MaxJobPayload
	// maxLeaseMillis keeps a lease within what a tick count can hold.
	maxLeaseMillis = 10 * 60 * 1000
)

// ErrWire wraps every decoding failure.
var ErrWire = errors.New("gossip: malformed message")

// Claim is a candidacy or heartbeat on the wire.
type Claim struct {
	Candidacy   bool // type 0x01; false: heartbeat (0x02)
	Term        uint64
	IssuedAt    time.Time // millisecond precision
	Lease       time.Duration
	Seq         uint64
	Resign      bool
	Coordinator lpeer.ID
	Beacon      [election.BeaconSize]byte
	Salt        [election.SaltSize]byte
	Parent      ClaimParent
	Evidence    []byte
}

// ClaimParent is the heartbeat a claim descends from (zero: none).
type ClaimParent struct {
	Term        uint64
	Coordinator lpeer.ID
	Seq         uint64
	Beacon      [election.BeaconSize]byte
}

// Vote says Voter follows Coordinator in Term. It may carry the proof of
// Coordinator's claim for Term (Salt, Parent, Evidence; none when Evidence
// is empty): only a proven vote can make a coordinator open a new term.
type Vote struct {
	Term        uint64
	IssuedAt    time.Time
	Voter       lpeer.ID
	Coordinator lpeer.ID
	Salt        [election.SaltSize]byte
	Parent      ClaimParent
	Evidence    []byte
}

// PresenceMsg is a node's heartbeat with its sealed capability record.
type PresenceMsg struct {
	IssuedAt   time.Time
	Capability []byte
}

// JobMsg is a raw job announcement carrying its sender's accepted term.
type JobMsg struct {
	Term     uint64
	IssuedAt time.Time
	Payload  []byte
}

// --- encoding ---------------------------------------------------------

func appendHeader(b []byte, t MsgType) []byte { return append(b, byte(t), WireVersion) }

func appendTime(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixMilli()))
}

func appendID(b []byte, id lpeer.ID) ([]byte, error) {
	if len(id) > MaxPeerIDBytes {
		return nil, fmt.Errorf("%w: peer id of %d bytes", ErrWire, len(id))
	}
	b = append(b, byte(len(id)))
	return append(b, id...), nil
}

// Marshal encodes the claim.
func (c *Claim) Marshal() ([]byte, error) {
	if c.Term == 0 || c.Coordinator == "" || len(c.Evidence) == 0 || len(c.Evidence) > MaxEvidenceBytes {
		return nil, fmt.Errorf("%w: claim needs a term, a coordinator and 1..%d bytes of evidence", ErrWire, MaxEvidenceBytes)
	}
	ms := c.Lease.Milliseconds()
	if ms <= 0 || ms > maxLeaseMillis {
		return nil, fmt.Errorf("%w: lease %v out of range", ErrWire, c.Lease)
	}
	t := TypeHeartbeat
	if c.Candidacy {
		t = TypeCandidacy
	}
	b := make([]byte, 0, claimFixed+len(c.Coordinator)+len(c.Parent.Coordinator)+len(c.Evidence))
	b = appendHeader(b, t)
	b = binary.BigEndian.AppendUint64(b, c.Term)
	b = appendTime(b, c.IssuedAt)
	b = binary.BigEndian.AppendUint32(b, uint32(ms))
	b = binary.BigEndian.AppendUint64(b, c.Seq)
	var flags byte
	if c.Resign {
		flags |= 1
	}
	b = append(b, flags)
	var err error
	if b, err = appendID(b, c.Coordinator); err != nil {
		return nil, err
	}
	b = append(b, c.Beacon[:]...)
	b = append(b, c.Salt[:]...)
	b = binary.BigEndian.AppendUint64(b, c.Parent.Term)
	if b, err = appendID(b, c.Parent.Coordinator); err != nil {
		return nil, err
	}
	b = binary.BigEndian.AppendUint64(b, c.Parent.Seq)
	b = append(b, c.Parent.Beacon[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.Evidence)))
	return append(b, c.Evidence...), nil
}

// Marshal encodes the vote.
func (v *Vote) Marshal() ([]byte, error) {
	if v.Term == 0 || v.Voter == "" || v.Coordinator == "" {
		return nil, fmt.Errorf("%w: vote needs a term, a voter and a coordinator", ErrWire)
	}
	b := appendHeader(make([]byte, 0, 2+16+2+len(v.Voter)+len(v.Coordinator)), TypeVote)
	b = binary.BigEndian.AppendUint64(b, v.Term)
	b = appendTime(b, v.IssuedAt)
	var err error
	if b, err = appendID(b, v.Voter); err != nil {
		return nil, err
	}
	if b, err = appendID(b, v.Coordinator); err != nil {
		return nil, err
	}
	if len(v.Evidence) == 0 {
		if v.Salt != ([election.SaltSize]byte{}) || v.Parent != (ClaimParent{}) {
			return nil, fmt.Errorf("%w: vote proof without evidence", ErrWire)
		}
		return b, nil
	}
	switch {
	case len(v.Evidence) > MaxEvidenceBytes:
		return nil, fmt.Errorf("%w: vote proof evidence of %d bytes exceeds %d", ErrWire, len(v.Evidence), MaxEvidenceBytes)
	case v.Parent.Term >= v.Term:
		return nil, fmt.Errorf("%w: vote proof parent term %d not older than term %d", ErrWire, v.Parent.Term, v.Term)
	case (v.Parent.Term == 0) != (v.Parent.Coordinator == ""):
		return nil, fmt.Errorf("%w: vote proof parent term and coordinator must be both set or both empty", ErrWire)
	}
	b = append(b, v.Salt[:]...)
	b = binary.BigEndian.AppendUint64(b, v.Parent.Term)
	if b, err = appendID(b, v.Parent.Coordinator); err != nil {
		return nil, err
	}
	b = binary.BigEndian.AppendUint64(b, v.Parent.Seq)
	b = append(b, v.Parent.Beacon[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(v.Evidence)))
	return append(b, v.Evidence...), nil
}

// Marshal encodes the presence heartbeat.
func (p *PresenceMsg) Marshal() ([]byte, error) {
	if len(p.Capability) == 0 || len(p.Capability) > hpeer.MaxCapabilityBytes {
		return nil, fmt.Errorf("%w: capability of %d bytes (1..%d)", ErrWire, len(p.Capability), hpeer.MaxCapabilityBytes)
	}
	b := appendHeader(make([]byte, 0, 12+len(p.Capability)), TypePresence)
	b = appendTime(b, p.IssuedAt)
	b = binary.BigEndian.AppendUint16(b, uint16(len(p.Capability)))
	return append(b, p.Capability...), nil
}

// Marshal encodes the job message.
func (j *JobMsg) Marshal() ([]byte, error) {
	if len(j.Payload) > MaxJobPayload {
		return nil, fmt.Errorf("%w: job payload of %d bytes exceeds %d", ErrWire, len(j.Payload), MaxJobPayload)
	}
	b := appendHeader(make([]byte, 0, 22+len(j.Payload)), TypeJob)
	b = binary.BigEndian.AppendUint64(b, j.Term)
	b = appendTime(b, j.IssuedAt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(j.Payload)))
	return append(b, j.Payload...), nil
}

// --- decoding ---------------------------------------------------------

// reader consumes a message front to back; the first failure sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrWire}, a...)...)
	}
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.fail("%s: need %d bytes, %d left", what, n, len(r.b))
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8(what string) uint8 {
	if b := r.take(1, what); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16(what string) uint16 {
	if b := r.take(2, what); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if b := r.take(4, what); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if b := r.take(8, what); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) time(what string) time.Time {
	ms := int64(r.u64(what))
	if r.err == nil && (ms < 0 || ms > 1<<53) {
		r.fail("%s: %d ms out of range", what, ms)
	}
	return time.UnixMilli(ms)
}

func (r *reader) fixed(dst []byte, what string) {
	if b := r.take(len(dst), what); b != nil {
		copy(dst, b)
	}
}

// bytes reads a length-prefixed field bounded by [min, max] and copies it,
// so the result does not alias the message buffer.
func (r *reader) bytes(n int, min, max int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < min || n > max {
		r.fail("%s: length %d not in %d..%d", what, n, min, max)
		return nil
	}
	b := r.take(n, what)
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, n), b...)
}

// id reads an id8 peer ID; empty is allowed only when optional.
func (r *reader) id(what string, optional bool) lpeer.ID {
	n := int(r.u8(what))
	if r.err != nil {
		return ""
	}
	if n == 0 {
		if !optional {
			r.fail("%s: empty peer id", what)
		}
		return ""
	}
	if n > MaxPeerIDBytes {
		r.fail("%s: peer id of %d bytes exceeds %d", what, n, MaxPeerIDBytes)
		return ""
	}
	b := r.take(n, what)
	if b == nil {
		return ""
	}
	id, err := lpeer.IDFromBytes(b)
	if err != nil {
		r.fail("%s: %v", what, err)
		return ""
	}
	return id
}

func (r *reader) header(want ...MsgType) MsgType {
	t := MsgType(r.u8("type"))
	v := r.u8("version")
	if r.err != nil {
		return 0
	}
	ok := false
	for _, w := range want {
		ok = ok || t == w
	}
	if !ok {
		r.fail("unknown message type 0x%02x", uint8(t))
		return 0
	}
	if v != WireVersion {
		r.fail("%s version %d, this build reads %d", t, v, WireVersion)
	}
	return t
}

func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	return r.err
}

func (t MsgType) String() string {
	switch t {
	case TypeCandidacy:
		return "candidacy"
	case TypeHeartbeat:
		return "heartbeat"
	case TypeVote:
		return "vote"
	case TypePresence:
		return "presence"
	case TypeJob:
		return "job"
	}
	return fmt.Sprintf("type 0x%02x", uint8(t))
}

// DecodeElection decodes an election-topic message: exactly one of the
// results is non-nil when err is nil.
func DecodeElection(b []byte) (*Claim, *Vote, error) {
	if len(b) > MaxElectionBytes {
		return nil, nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrWire, len(b), MaxElectionBytes)
	}
	r := &reader{b: b}
	switch r.header(TypeCandidacy, TypeHeartbeat, TypeVote) {
	case TypeVote:
		v := &Vote{}
		v.Term = r.u64("term")
		v.IssuedAt = r.time("issued_at")
		v.Voter = r.id("voter", false)
		v.Coordinator = r.id("coordinator", false)
		if r.err == nil && v.Term == 0 {
			r.fail("vote for term 0")
		}
		if r.err == nil && len(r.b) > 0 {
			r.fixed(v.Salt[:], "proof salt")
			v.Parent.Term = r.u64("proof parent_term")
			v.Parent.Coordinator = r.id("proof parent_coordinator", true)
			v.Parent.Seq = r.u64("proof parent_seq")
			r.fixed(v.Parent.Beacon[:], "proof parent_beacon")
			n := r.u32("proof evidence length")
			v.Evidence = r.bytes(int(n), 1, MaxEvidenceBytes, "proof evidence")
			if r.err == nil {
				switch {
				case v.Parent.Term >= v.Term:
					r.fail("proof parent term %d not older than term %d", v.Parent.Term, v.Term)
				case (v.Parent.Term == 0) != (v.Parent.Coordinator == ""):
					r.fail("proof parent term and coordinator must be both set or both empty")
				}
			}
		}
		if err := r.end(); err != nil {
			return nil, nil, err
		}
		return nil, v, nil
	case TypeCandidacy, TypeHeartbeat:
		c := &Claim{Candidacy: b[0] == byte(TypeCandidacy)}
		c.Term = r.u64("term")
		c.IssuedAt = r.time("issued_at")
		ms := r.u32("lease_ms")
		c.Lease = time.Duration(ms) * time.Millisecond
		c.Seq = r.u64("seq")
		flags := r.u8("flags")
		c.Resign = flags&1 != 0
		c.Coordinator = r.id("coordinator", false)
		r.fixed(c.Beacon[:], "beacon")
		r.fixed(c.Salt[:], "salt")
		c.Parent.Term = r.u64("parent_term")
		c.Parent.Coordinator = r.id("parent_coordinator", true)
		c.Parent.Seq = r.u64("parent_seq")
		r.fixed(c.Parent.Beacon[:], "parent_beacon")
		n := r.u32("evidence length")
		c.Evidence = r.bytes(int(n), 1, MaxEvidenceBytes, "evidence")
		if r.err == nil {
			switch {
			case flags&^1 != 0:
				r.fail("unknown flags 0x%02x", flags)
			case c.Term == 0:
				r.fail("claim for term 0")
			case ms == 0 || ms > maxLeaseMillis:
				r.fail("lease %d ms out of range", ms)
			case c.Parent.Term >= c.Term:
				r.fail("parent term %d not older than term %d", c.Parent.Term, c.Term)
			case (c.Parent.Term == 0) != (c.Parent.Coordinator == ""):
				r.fail("parent term and coordinator must be both set or both empty")
			}
		}
		if err := r.end(); err != nil {
			return nil, nil, err
		}
		return c, nil, nil
	}
	return nil, nil, r.end()
}

// DecodePresence decodes a presence-topic message. It does not open the
// capability; the validator does.
func DecodePresence(b []byte) (*PresenceMsg, error) {
	if len(b) > MaxPresenceBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrWire, len(b), MaxPresenceBytes)
	}
	r := &reader{b: b}
	r.header(TypePresence)
	p := &PresenceMsg{}
	p.IssuedAt = r.time("issued_at")
	n := r.u16("capability length")
	p.Capability = r.bytes(int(n), 1, hpeer.MaxCapabilityBytes, "capability")
	if err := r.end(); err != nil {
		return nil, err
	}
	return p, nil
}

// DecodeJob decodes a jobs-topic message.
func DecodeJob(b []byte) (*JobMsg, error) {
	if len(b) > MaxJobBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrWire, len(b), MaxJobBytes)
	}
	r := &reader{b: b}
	r.header(TypeJob)
	j := &JobMsg{}
	j.Term = r.u64("term")
	j.IssuedAt = r.time("issued_at")
	n := r.u32("payload length")
	j.Payload = r.bytes(int(n), 0, MaxJobPayload, "payload")
	if err := r.end(); err != nil {
		return nil, err
	}
	return j, nil
}
