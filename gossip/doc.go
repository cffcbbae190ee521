// Package gossip runs a holopeer swarm's GossipSub topics and its
// coordinator election.
//
// # Topics
//
// Every swarm has three topics, each with a validator:
//
//	/holopeer/<swarm>/presence/1   each node's heartbeat with its sealed capability record
//	/holopeer/<swarm>/election/1   candidacies, coordinator heartbeats (term, lease, evidence), votes
//	/holopeer/<swarm>/jobs/1       raw job messages carrying the sender's term (for the Jobs issue)
//
// Messages are signed by their author (pubsub StrictSign). A validator
// checks, in order: the size limit of the topic; the schema (a type byte, a
// version byte and a bounded body, see wire.go); that the signed author is
// the peer the message names (claimant, voter, capability owner); the
// freshness window against the injected clock; then what the topic needs —
// the TEE evidence of a claim, bound to the author's identity key, the
// swarm, the term and the election's nonce (package election); a
// capability record that opens and belongs to the author and the swarm.
// Forgeries are rejected (the forwarder loses peer score: a few put it
// below the gossip threshold and out of our meshes, five graylist it);
// stale, duplicate and older-term messages are ignored without penalty.
// Every rejection is logged with its reason, at most once per 10 s per
// (topic, reason, author), and counted in Stats.
//
// Peer scoring ignores IP colocation (volunteers behind one home router
// share an IP) and has no mesh-delivery deficit penalty (it would punish
// the honest peers of a quiet election topic).
//
// # Election
//
// The rules live in package election, a pure state machine. The Service
// owns one election.Node in one goroutine: ticks from the clock, messages
// from the election subscription, attestation results from the attester;
// it publishes what the node returns, keeps the fencing floor (AcceptTerm)
// and, with WithStateFile, persists it across restarts. Everything a
// coordinator sends must carry its term; check it with AcceptTerm.
//
// # Wiring (holopeer up)
//
//	mode, _ := tee.ParseMode(teeFlag)                              // auto|snp|tdx|sim|none
//	att, err := tee.NewAttester(ctx, mode, tee.WithSimKey(tee.SimTestnetKey(swarm))) // nil for none
//	ver, err := tee.NewVerifier(tee.Policy{AllowSim: allowSim /* SNP/TDX measurements */})
//	g, err := gossip.New(ctx, node.Libp2p(),
//		gossip.WithSwarm(swarm),
//		gossip.WithTEE(att, ver),          // att == nil: votes and follows, never stands
//		gossip.WithAllowSim(allowSim),
//		gossip.WithCapability(func() ([]byte, error) { _, b := node.Capability(); return b, nil }),
//		gossip.WithStateFile(filepath.Join(dataDir, "election.json")),
//		gossip.WithLogger(log))
//	defer g.Close()
//	c := g.Coordinator() // nil, or PeerID, Term, TEE, Insecure, LeaseExpires, Self
package gossip
