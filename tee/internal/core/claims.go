package core

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Bounds on the claims, checked by Validate, Marshal and UnmarshalEvidence.
const (
	MaxSwarmBytes       = 256
	MaxIdentityKeyBytes = 1024 // a marshalled RSA-4096 libp2p key is ~550 bytes
	MinNonceBytes       = 16
	MaxNonceBytes       = 64
)

// BindingDomain separates holopeer's report data from any other use of the
// same hardware report. Changing the binding means changing this string.
const BindingDomain = "holopeer-tee-v1"

// Claims are what a piece of evidence vouches for: this identity key, in this
// swarm, answered this nonce, for this election term.
type Claims struct {
	Swarm string
	// IdentityKey is the peer's libp2p identity public key as
	// crypto.MarshalPublicKey encodes it (the bytes its peer ID hashes).
	IdentityKey []byte
	// Nonce is the freshness challenge (the election's nonce for the term or
	// a verifier's own challenge), MinNonceBytes..MaxNonceBytes long.
	Nonce []byte
	Term  uint64
}

// Validate checks that every field is present and within bounds.
func (c Claims) Validate() error {
	switch {
	case c.Swarm == "" || len(c.Swarm) > MaxSwarmBytes:
		return fmt.Errorf("%w: swarm name length %d not in 1..%d", ErrMalformed, len(c.Swarm), MaxSwarmBytes)
	case len(c.IdentityKey) == 0 || len(c.IdentityKey) > MaxIdentityKeyBytes:
		return fmt.Errorf("%w: identity key length %d not in 1..%d", ErrMalformed, len(c.IdentityKey), MaxIdentityKeyBytes)
	case len(c.Nonce) < MinNonceBytes || len(c.Nonce) > MaxNonceBytes:
		return fmt.Errorf("%w: nonce length %d not in %d..%d", ErrMalformed, len(c.Nonce), MinNonceBytes, MaxNonceBytes)
	}
	return nil
}

// Equal reports whether two claims are identical.
func (c Claims) Equal(o Claims) bool {
	return c.Swarm == o.Swarm && c.Term == o.Term &&
		bytes.Equal(c.IdentityKey, o.IdentityKey) && bytes.Equal(c.Nonce, o.Nonce)
}

// ReportData is the 64 bytes every provider places in its hardware report's
// REPORT_DATA field:
//
//	SHA-512( "holopeer-tee-v1" ‖ 0x00 ‖ lp(swarm) ‖ lp(identity key) ‖ lp(nonce) ‖ u64be(term) )
//
// where lp(x) is x's length as a big-endian uint32 followed by x. Length
// prefixes keep field boundaries unambiguous, so no two distinct claims hash
// the same input. Verifiers never trust a REPORT_DATA they did not compute:
// they call ReportData on the claims they expect.
func ReportData(c Claims) [64]byte {
	h := sha512.New()
	h.Write([]byte(BindingDomain))
	h.Write([]byte{0})
	lp := func(b []byte) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	lp([]byte(c.Swarm))
	lp(c.IdentityKey)
	lp(c.Nonce)
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], c.Term)
	h.Write(t[:])
	var out [64]byte
	h.Sum(out[:0])
	return out
}

// PeerID is the libp2p peer ID of the claimed identity key, for checking
// that the evidence speaks for the peer that sent it.
func (c Claims) PeerID() (peer.ID, error) {
	pub, err := crypto.UnmarshalPublicKey(c.IdentityKey)
	if err != nil {
		return "", fmt.Errorf("%w: identity key: %v", ErrMalformed, err)
	}
	return peer.IDFromPublicKey(pub)
}
