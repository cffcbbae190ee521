package gossip

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
)

// Peer-score thresholds. A single invalid message costs
// InvalidMessageDeliveriesWeight × 1² = -100, so a peer that sends a few
// is below GossipThreshold (no gossip to or from it) and is pruned from
// our meshes (gossipsub prunes negative scores at each heartbeat); after
// five it is graylisted and its traffic is ignored outright. The penalty
// decays over hours, so a persistent offender stays out.
var scoreThresholds = pubsub.PeerScoreThresholds{
	GossipThreshold:             -500,
	PublishThreshold:            -1000,
	GraylistThreshold:           -2500,
	AcceptPXThreshold:           10,
	OpportunisticGraftThreshold: 3,
}

// scoreParams builds the scoring for the swarm's topics.
func scoreParams(topics []string) *pubsub.PeerScoreParams {
	p := &pubsub.PeerScoreParams{
		Topics:        map[string]*pubsub.TopicScoreParams{},
		TopicScoreCap: 50,
		// No application score yet; the Jobs issue may add contribution
		// receipts here.
		AppSpecificScore:  func(lpeer.ID) float64 { return 0 },
		AppSpecificWeight: 1,
		// Home routers put many volunteers behind one public IP; an IP
		// colocation penalty would punish them for it.
		IPColocationFactorWeight: 0,
		// Broken promises and early re-grafts.
		BehaviourPenaltyWeight:    -10,
		BehaviourPenaltyThreshold: 6,
		BehaviourPenaltyDecay:     pubsub.ScoreParameterDecay(10 * time.Minute),
		DecayInterval:             time.Second,
		DecayToZero:               0.01,
		RetainScore:               time.Hour,
	}
	for _, t := range topics {
		p.Topics[t] = &pubsub.TopicScoreParams{
			// Zero fields are left out rather than validated: in
			// particular no mesh-delivery deficit penalty (P3), which
			// punishes honest peers of a quiet topic such as elections.
			SkipAtomicValidation:           true,
			TopicWeight:                    1,
			TimeInMeshWeight:               0.01,
			TimeInMeshQuantum:              time.Second,
			TimeInMeshCap:                  100,
			FirstMessageDeliveriesWeight:   0.5,
			FirstMessageDeliveriesDecay:    pubsub.ScoreParameterDecay(10 * time.Minute),
			FirstMessageDeliveriesCap:      20,
			InvalidMessageDeliveriesWeight: -100,
			InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(4 * time.Hour),
		}
	}
	return p
}
