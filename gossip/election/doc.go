// Package election chooses a swarm's coordinator. It is a pure state
// machine in the manner of etcd raft: messages enter through Step, time
// enters through Tick (logical ticks, no clock), and everything the node
// wants done — messages to publish, an attestation to make, a changed view
// — comes out of Ready for the caller to carry out. It holds no sockets, no
// goroutines and no wall clock, so every rule below is tested by scripts on
// an in-memory network (see the tests).
//
// # Who takes part
//
// Every peer follows and votes. A peer stands (is a candidate) only if it can
// attest: it runs in a confidential VM whose hardware report binds its libp2p
// identity key (Config.CanStand). A Mac, a plain CPU box or a node started
// with --tee none never stands, never becomes coordinator, but verifies,
// follows and votes like every other peer.
//
// # Terms and claims
//
// A term is a number. A coordinator holds exactly one term, which it opens
// with a Candidacy and keeps alive with Heartbeats. Both are claims and carry
// the same proof: (Term, Parent, Salt, Evidence), where Evidence is a TEE
// report binding (swarm, the author's identity key, Nonce, Term), verified by
// each peer itself through Config.Verify before it follows anyone. A claim
// for a term older than the newest a peer accepted is refused (ErrStaleTerm).
//
// A claim more than Config.MaxTermJump (default 2^16) above the newest term
// a peer accepted is refused as well (ErrTermJump) and not remembered: the
// anchor is the peer's own accepted term, so one hostile claim, even with
// valid evidence, moves neither the next term a candidate computes nor the
// floor the caller persists. Term arithmetic saturates instead of wrapping:
// at 2^64−1 a peer follows but never stands, and with the bound that takes
// 2^48 claims to reach.
//
// Each peer records the coordinator it accepted for its newest term and
// never switches within a term: a second valid claim for the same term from
// someone else is refused (ErrConflict), however good its rank. Since the
// accepted term only grows and its coordinator is fixed once set, no honest
// peer follows two coordinators in one term (safety).
//
// # Leases
//
// A follower counts the lease in its own ticks: each heartbeat of its
// coordinator restarts the count, and the lease lapses after
// min(Config.LeaseTicks, claim.LeaseTicks) ticks without one. Leases decide
// liveness only. Mutual exclusion comes from the term used as a fencing
// token: everything a coordinator sends carries its term, and AcceptTerm (or
// Fence) refuses anything older than the newest term accepted, because a
// lease alone cannot give mutual exclusion when clocks drift or a process
// pauses.
//
// # Rank and backoff
//
// When its lease lapses a standing peer becomes a candidate for
// T = max(accepted, highest valid seen) + 1. Its rank for T is the first 8
// bytes of SHA-256("holopeer/election/rank/v1" ‖ T ‖ peer id), lower being
// better; it is deterministic, so all peers agree on it, and it changes with
// the term, so no peer is always first. The candidate waits
// BackoffTicks × (number of known live candidates of better rank), at most
// MaxBackoffTicks, then asks for attestation and claims T. Any valid claim
// for a term above its own view that it hears meanwhile ends its candidacy.
// A newly started peer first listens for a whole lease, so it joins a
// running swarm rather than disturbing it.
//
// # Votes
//
// A follower publishes a Vote (term, coordinator) when it accepts a
// coordinator and again every VoteTicks while it follows; the coordinator
// counts them (Followers), so it knows which peers will accept its
// commands. A vote carries the proof (parent, salt, evidence) of the claim
// the voter accepted. A peer that hears a valid claim for its accepted term
// from someone else votes at once: the other claimant, or whoever
// coordinates that term, learns the term is contested and opens the next
// one, which the voter can follow. A follower with no live coordinator that
// hears a claim older than its term votes too (at most once per two
// heartbeats): it accepted a term whose coordinator died before anyone else
// heard it, and the live coordinator of the older term must open one above
// it, or the follower would refuse it forever. This is how a peer whose
// coordinator died in a split or unheard term gets back.
//
// A coordinator acts on such a vote only if its proof verifies for the
// named coordinator and term (and the term is within MaxTermJump): votes
// are signed by any peer, so a peer without a TEE voting for a coordinator
// that never claimed moves nothing, and a real claim moves a coordinator
// once, since the term it opens leaves that claim behind. The caller
// persists the proof with the term (Status.Proof, Config.RestoreProof) so
// a restarted follower can still prove its term.
//
// # Conflicts and partitions
//
// Two candidates may claim the same term (views of the candidate set
// differed, or a partition elected on both sides). The coordinators settle
// it by rank: the better-ranked one claims T+1 at once, the other sends a
// last heartbeat marked Resign (its followers stop following it now) and
// waits a lease before it may stand again. A follower that put off a newer
// claim while its coordinator was live follows that claim as soon as its
// coordinator lapses or resigns, rather than opening yet another term. Peers of both
// sides then accept T+1, because a higher term always wins once its parent
// rule (below) lets it through. A minority side of a partition may elect its
// own coordinator in a higher term; when the partition heals, the
// coordinator of the lower term accepts the higher claim and steps down, its
// followers' leases lapse, and they follow the higher term: one coordinator.
//
// # The nonce: fresh, not preparable, not replayable
//
// Every heartbeat carries a Beacon, HMAC-SHA256(termSecret, term ‖ seq),
// where termSecret is 32 random bytes the coordinator draws when its term
// starts: unpredictable to everyone else, yet the coordinator can recognise
// any of its own beacons later. A candidate's Parent is the newest heartbeat
// it accepted (term, coordinator, seq, beacon; all zero for a swarm's first
// election) and its Salt is 32 fresh random bytes of its own. The nonce is
//
//	SHA-256("holopeer/election/nonce/v1" ‖ lp(swarm) ‖ T ‖ parent.Term ‖
//	        lp(parent.Coordinator) ‖ parent.Seq ‖ parent.Beacon ‖ salt)
//
// and the evidence must bind it. Why this works:
//   - Replay: evidence binds the term and the author's identity key, so a
//     report made for term 3 fails for term 7 (binding mismatch), and one
//     made for another key fails for this author (pubsub's strict signature
//     makes the author unforgeable).
//   - Preparation ahead: the nonce includes a beacon that did not exist
//     before the parent heartbeat was sent. A peer whose own (term,
//     coordinator) is the parent checks the beacon: the coordinator itself
//     recomputes it from its secret, a follower looks it up among the last
//     BeaconMemory heartbeats it received. A beacon that does not match is a
//     forgery (ErrForgedParent). While its lease is live a follower also
//     refuses a claim it cannot check (ErrUncheckedParent): it never leaves
//     a live coordinator for a claim that cannot show it was made after that
//     coordinator's recent heartbeats, unless the coordinator itself steps
//     down. A peer with no live coordinator (a newcomer, or the other side
//     of a healed partition after its own coordinator yielded) cannot check
//     a parent it never saw and accepts on the evidence alone; that residual
//     window is why the identity key must be born inside the CVM and never
//     leave it, so that only the measured code ever signs a claim.
//   - The salt makes two candidacies from the same parent distinct, so no
//     two terms ever share a nonce even if a parent repeats.
//
// # Properties kept
//
//   - Safety: no honest peer follows two coordinators in one term; a peer
//     without valid evidence is never followed.
//   - Liveness: after the coordinator dies, every connected honest peer
//     follows a new one within LeaseTicks + MaxBackoffTicks plus the
//     attestation and delivery time. A follower stranded in a newer term
//     whose coordinator died follows the live coordinator again within a
//     heartbeat or two plus the attestation and delivery time.
//   - Convergence: once a partition heals and messages flow, all peers
//     follow one coordinator (the highest term) within about two leases.
//
// The randomized kill/partition/heal test checks the first property after
// every step of every peer, and the other two after each heal.
package election
