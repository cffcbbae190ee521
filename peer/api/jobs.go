package api

import "time"

// JobStatus is what a node knows of one job: its own if it is the
// researcher or a stage, or what the job's researcher gossiped. The
// dashboard plots Loss and TokensPerS; `holopeer status` lists jobs.
type JobStatus struct {
	JobID      string  `json:"job_id"`
	Name       string  `json:"name"`
	Kind       string  `json:"kind"`  // train | serve
	State      string  `json:"state"` // placing | loading | running | recovering | done | failed
	Researcher string  `json:"researcher"`
	Codec      string  `json:"codec"`
	Step       int     `json:"step"`
	Steps      int     `json:"steps"`
	Loss       []Point `json:"loss"` // (step, loss), oldest first
	TokensPerS float64 `json:"tokens_per_s"`
	// BytesSent is what crossed stage boundaries, by codec.
	BytesSent     map[string]int64 `json:"bytes_sent"`
	BytesPerToken float64          `json:"bytes_per_token"`
	Stages        []JobStage       `json:"stages"`
	Recoveries    int              `json:"recoveries"`
	Updated       time.Time        `json:"updated"`
	Error         string           `json:"error,omitempty"`
}

// Point is one sample of a curve.
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// JobStage is one stage of a job's current plan.
type JobStage struct {
	Index    int      `json:"index"`
	First    int      `json:"first"` // blocks [first, last)
	Last     int      `json:"last"`
	Replicas []string `json:"replicas"`
	Path     string   `json:"path,omitempty"` // direct | relayed, as the researcher sees its link
}

// LedgerEntry is one contributor's standing.
type LedgerEntry struct {
	PeerID    string  `json:"peer_id"`
	Points    float64 `json:"points"`
	PresenceS float64 `json:"presence_s"`
	ComputeS  float64 `json:"compute_s"`
	Tokens    int64   `json:"tokens"`
	Receipts  int     `json:"receipts"`
}
