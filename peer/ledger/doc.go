// Package ledger is the swarm's contribution ledger: signed receipts that
// credit each peer for the time it lent, the compute it did and the tokens
// it processed, and the arithmetic anyone can redo to check a peer's total.
//
// # Receipts
//
// At each checkpoint interval the coordinator signs one Receipt per node
// with its libp2p identity key (Sign). The signature covers a canonical
// binary encoding of every field under the domain prefix
// "holopeer/ledger/receipt/v1", so a receipt cannot be replayed as any
// other signed holopeer message and no field can change without breaking
// it. The signer's public key is inside its (Ed25519) peer id, so a
// receipt carries everything needed to check its signature.
//
// Receipts are gossiped; every node keeps the ones it hears in a Store, an
// append-only JSON-lines file in its data dir, bounded and deduplicated by
// receipt hash.
//
// # Who may sign
//
// A signature alone proves only who signed. A receipt counts only if its
// signer was the coordinator of the receipt's term, which Verify asks a
// TermHistory. Each node records the coordinators its election accepted
// (after checking their attestation itself) in a History saved beside the
// receipts, so `holopeer ledger verify` can run offline on a copy of a data
// dir.
//
// # Points
//
// Points(r) = PresenceS/3600 + ComputeS/60 + Tokens/10000
//
// that is 1 point per hour a machine is on offer, 1 point per minute it
// spends computing for a job, and 1 point per 10,000 tokens it processes.
// Presence is cheap to give (an idle machine), so it earns least; compute
// time rewards lending a machine to real work whatever its speed; tokens
// reward throughput, so a faster machine earns more for the same minutes.
//
// # What Verify rejects
//
// Malformed fields, a bad signature (which covers tampering with any
// field), a receipt for another swarm, a term the history does not know or
// whose signer was not its coordinator, a duplicate, and a receipt that
// overlaps one already counted for the same peer: the same job steps twice,
// or presence for the same time twice. Verify sorts receipts by (issued at,
// term, hash) first, so its answer does not depend on the order receipts
// arrived in.
package ledger
