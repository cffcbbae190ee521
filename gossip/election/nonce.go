package election

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

const (
	nonceDomain  = "holopeer/election/nonce/v1"
	rankDomain   = "holopeer/election/rank/v1"
	beaconDomain = "holopeer/election/beacon/v1"
)

// Nonce is the value a candidate's evidence for term must bind (see the
// package doc). Length-prefixed fields keep different inputs from hashing
// the same bytes.
func Nonce(swarm string, term uint64, p Parent, salt [SaltSize]byte) [NonceSize]byte {
	h := sha256.New()
	h.Write([]byte(nonceDomain))
	lp(h, []byte(swarm))
	u64(h, term)
	u64(h, p.Term)
	lp(h, []byte(p.Coordinator))
	u64(h, p.Seq)
	h.Write(p.Beacon[:])
	h.Write(salt[:])
	var out [NonceSize]byte
	h.Sum(out[:0])
	return out
}

// Rank orders peers for a term: lower is better. Every peer computes the
// same rank, and it changes from term to term.
func Rank(id string, term uint64) uint64 {
	h := sha256.New()
	h.Write([]byte(rankDomain))
	u64(h, term)
	h.Write([]byte(id))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// Better reports whether a outranks b in term (ties, which need a hash
// collision, fall back to the ids).
func Better(a, b string, term uint64) bool {
	ra, rb := Rank(a, term), Rank(b, term)
	if ra != rb {
		return ra < rb
	}
	return a < b
}

// beacon derives the coordinator's beacon for heartbeat seq of term.
func beacon(secret [32]byte, term, seq uint64) [BeaconSize]byte {
	m := hmac.New(sha256.New, secret[:])
	m.Write([]byte(beaconDomain))
	u64(m, term)
	u64(m, seq)
	var out [BeaconSize]byte
	m.Sum(out[:0])
	return out
}

func lp(h hash.Hash, b []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	h.Write(n[:])
	h.Write(b)
}

func u64(h hash.Hash, v uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	h.Write(b[:])
}
