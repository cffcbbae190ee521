package peer

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
)

// MaxCapabilityBytes bounds a sealed capability record on the wire. A real
// record is a few hundred bytes; anything larger is refused unread.
const MaxCapabilityBytes = 8 << 10

// Capability is what a node offers the swarm. It is signed by the node's
// identity key (a libp2p record envelope), so anyone holding it can check
// who made the claims, and it is versioned by Seq so a newer one wins.
//
// Keep field names stable: the placement planner, gossip presence and the
// dashboard read them.
type Capability struct {
	PeerID       string    `json:"peer_id"`
	Swarm        string    `json:"swarm"`
	Seq          uint64    `json:"seq"`                   // strictly increasing per node
	IssuedAt     time.Time `json:"issued_at"`             // freshness hint, not trusted for ordering
	Version      string    `json:"version"`               // holopeer version
	Platform     string    `json:"platform"`              // GOOS/GOARCH
	Backend      string    `json:"backend"`               // cpu | cuda | metal
	CPUs         int       `json:"cpus"`                  // cores it computes with
	MemoryBytes  uint64    `json:"memory_bytes"`          // memory it lends to stages
	GFLOPS       float64   `json:"gflops"`                // measured GEMM throughput of Backend
	Hours        string    `json:"hours"`                 // when it is on offer, e.g. "always" or "18:00-08:00"
	TEE          string    `json:"tee"`                   // snp | tdx | sim | none
	CanAttest    bool      `json:"can_attest"`            // holds evidence a verifier may accept
	Reachability string    `json:"reachability"`          // public | private | unknown
	Relayed      bool      `json:"relayed"`               // reachable only through a relay: keep off pipeline links
	NATMapping   string    `json:"nat_mapping,omitempty"` // endpoint-independent | endpoint-dependent | unknown; "" when not behind NAT
	APIAddr      string    `json:"api,omitempty"`         // informational only
}

// Validate checks the fields a planner relies on.
func (c *Capability) Validate() error {
	switch {
	case c.PeerID == "":
		return errors.New("capability: empty peer_id")
	case c.Swarm == "":
		return errors.New("capability: empty swarm")
	case c.Backend != "cpu" && c.Backend != "cuda" && c.Backend != "metal":
		return fmt.Errorf("capability: backend %q is not cpu, cuda or metal", c.Backend)
	case c.GFLOPS < 0 || c.GFLOPS > 1e7:
		return fmt.Errorf("capability: gflops %g out of range", c.GFLOPS)
	case c.CPUs < 0 || c.CPUs > 1<<16:
		return fmt.Errorf("capability: cpus %d out of range", c.CPUs)
	}
	switch c.Reachability {
	case "public", "private", "unknown":
	default:
		return fmt.Errorf("capability: reachability %q is not public, private or unknown", c.Reachability)
	}
	switch NATMapping(c.NATMapping) {
	case "", MappingUnknown, MappingIndependent, MappingDependent:
	default:
		return fmt.Errorf("capability: nat_mapping %q is not endpoint-independent, endpoint-dependent or unknown", c.NATMapping)
	}
	return nil
}

// capabilityRecord adapts Capability to libp2p's signed envelope.
type capabilityRecord struct{ Capability }

const capabilityDomain = "holopeer-capability"

// capabilityCodec is the envelope payload type. 0x0300 is in the range the
// multicodec table leaves unassigned; it only has to be unique within holopeer.
var capabilityCodec = []byte{0x03, 0x00}

func (r *capabilityRecord) Domain() string                 { return capabilityDomain }
func (r *capabilityRecord) Codec() []byte                  { return capabilityCodec }
func (r *capabilityRecord) MarshalRecord() ([]byte, error) { return json.Marshal(r.Capability) }
func (r *capabilityRecord) UnmarshalRecord(b []byte) error {
	if len(b) > MaxCapabilityBytes {
		return fmt.Errorf("capability: %d bytes exceeds %d", len(b), MaxCapabilityBytes)
	}
	return json.Unmarshal(b, &r.Capability)
}

// SealCapability signs c with key and returns the envelope bytes.
func SealCapability(c Capability, key crypto.PrivKey) ([]byte, error) {
	env, err := record.Seal(&capabilityRecord{c}, key)
	if err != nil {
		return nil, fmt.Errorf("capability: seal: %w", err)
	}
	return env.Marshal()
}

// OpenCapability verifies a sealed capability and returns it. It fails when
// the signature is bad, the record is malformed, or the signer is not the
// peer the record claims to describe.
func OpenCapability(b []byte) (Capability, error) {
	if len(b) > MaxCapabilityBytes {
		return Capability{}, fmt.Errorf("capability: %d bytes exceeds %d", len(b), MaxCapabilityBytes)
	}
	var rec capabilityRecord
	env, err := record.ConsumeTypedEnvelope(b, &rec)
	if err != nil {
		return Capability{}, fmt.Errorf("capability: open: %w", err)
	}
	signer, err := lpeer.IDFromPublicKey(env.PublicKey)
	if err != nil {
		return Capability{}, fmt.Errorf("capability: signer: %w", err)
	}
	if signer.String() != rec.PeerID {
		return Capability{}, fmt.Errorf("capability: signed by %s but claims peer %s", signer, rec.PeerID)
	}
	if err := rec.Validate(); err != nil {
		return Capability{}, err
	}
	return rec.Capability, nil
}
