package dashboard

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// State is what the page renders, served as JSON on PathState and pushed
// on PathEvents. Field names are for the page, not a stable API.
type State struct {
	Now         time.Time         `json:"now"`
	Node        Node              `json:"node"`
	Coordinator *Coordinator      `json:"coordinator"`
	Fleet       []FleetRow        `json:"fleet"` // this node first
	Jobs        []Job             `json:"jobs"`
	Bytes       []CodecBytes      `json:"bytes"` // summed over jobs, most first
	Leaderboard []api.LedgerEntry `json:"leaderboard"`
	Warnings    []string          `json:"warnings,omitempty"`
}

// Node is the node serving the page.
type Node struct {
	PeerID       string `json:"peer_id"`
	Swarm        string `json:"swarm"`
	Version      string `json:"version"`
	Reachability string `json:"reachability"`
	Backend      string `json:"backend"`
	TEE          string `json:"tee"`
}

// Coordinator is the coordinator followed, with how long its lease has left.
type Coordinator struct {
	api.Coordinator
	LeaseLeftS float64 `json:"lease_left_s"`
	Self       bool    `json:"self"`
}

// FleetRow is one machine of the swarm as this node sees it.
type FleetRow struct {
	PeerID       string  `json:"peer_id"`
	Self         bool    `json:"self"`
	Platform     string  `json:"platform"`
	Backend      string  `json:"backend"`
	GFLOPS       float64 `json:"gflops"`
	MemoryBytes  uint64  `json:"memory_bytes"`
	Reachability string  `json:"reachability"`
	Conn         string  `json:"conn"` // direct | relayed | self
	RelayReason  string  `json:"relay_reason,omitempty"`
	TEE          string  `json:"tee"`
	Attested     bool    `json:"attested"` // holds TEE evidence
	Insecure     bool    `json:"insecure"` // the evidence is sim: testnets only
	Coordinator  bool    `json:"coordinator"`
}

// Job is one job without its curve (the charts draw that).
type Job struct {
	JobID         string         `json:"job_id"`
	Name          string         `json:"name"`
	Kind          string         `json:"kind"`
	State         string         `json:"state"`
	Codec         string         `json:"codec"`
	Step          int            `json:"step"`
	Steps         int            `json:"steps"`
	TokensPerS    float64        `json:"tokens_per_s"`
	BytesPerToken float64        `json:"bytes_per_token"`
	BytesSent     int64          `json:"bytes_sent"`
	Recoveries    int            `json:"recoveries"`
	Stages        []api.JobStage `json:"stages"`
	Updated       time.Time      `json:"updated"`
	Error         string         `json:"error,omitempty"`
	LossPoints    int            `json:"loss_points"`
	LastLoss      *float64       `json:"last_loss"`
	// Chart is a version for the chart URLs: it changes when the curves do.
	Chart string `json:"chart"`
}

// CodecBytes is bytes on the wire with one codec.
type CodecBytes struct {
	Codec string `json:"codec"`
	Bytes int64  `json:"bytes"`
}

// Bounds on what one state carries: the page stays small whatever the
// network says.
const (
	maxFleetRows    = 1000
	maxJobsShown    = 32
	maxLeaderRows   = 100
	maxStringOnPage = 200
	stateTTL        = 250 * time.Millisecond // concurrent viewers share one read of the source
)

// state reads the source (at most once per stateTTL) and returns the view
// and its JSON.
func (d *Dashboard) state() (*State, []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if d.cached != nil && now.Sub(d.cachedAt) < stateTTL && !now.Before(d.cachedAt) {
		return d.cached, d.cachedJSON
	}
	st := d.build(now)
	b, err := json.Marshal(st)
	if err != nil {
		d.log.Error("dashboard: state", "err", err)
		b = []byte("{}")
	}
	d.cached, d.cachedJSON, d.cachedAt = st, b, now
	return st, b
}

// build assembles the view from the source. Callers hold d.mu.
func (d *Dashboard) build(now time.Time) *State {
	s := d.src.Status()
	jobs := d.src.Jobs()
	board := d.src.Leaderboard()

	st := &State{
		Now: now,
		Node: Node{PeerID: s.PeerID, Swarm: clip(s.Swarm), Version: clip(s.Version), Reachability: clip(s.Reachability),
			Backend: clip(s.Backend), TEE: clip(s.TEE)},
		Fleet:       []FleetRow{},
		Jobs:        []Job{},
		Bytes:       []CodecBytes{},
		Leaderboard: []api.LedgerEntry{},
		Warnings:    clipAll(s.Warnings, 10),
	}
	coordID := ""
	if c := s.Coordinator; c != nil {
		coordID = c.PeerID
		co := *c
		co.TEE = clip(co.TEE)
		st.Coordinator = &Coordinator{Coordinator: co, Self: c.PeerID == s.PeerID,
			LeaseLeftS: max(0, c.LeaseExpires.Sub(now).Seconds())}
	}
	self := FleetRow{PeerID: s.PeerID, Self: true, Backend: clip(s.Backend), Reachability: clip(s.Reachability),
		Conn: "self", TEE: clip(s.TEE), Coordinator: s.PeerID == coordID}
	self.Attested, self.Insecure = attested(s.TEE)
	st.Fleet = append(st.Fleet, self)
	peers := slices.Clone(s.Peers)
	slices.SortFunc(peers, func(a, b api.PeerStatus) int { return cmp.Compare(a.PeerID, b.PeerID) })
	for _, p := range peers {
		if len(st.Fleet) >= maxFleetRows {
			break
		}
		row := FleetRow{PeerID: clip(p.PeerID), Platform: clip(p.Platform), Backend: clip(p.Backend), GFLOPS: p.GFLOPS,
			MemoryBytes: p.MemoryBytes, Reachability: clip(p.Reachability), Conn: clip(p.Conn),
			RelayReason: clip(p.RelayReason), TEE: clip(p.TEE), Coordinator: p.PeerID == coordID}
		row.Attested, row.Insecure = attested(p.TEE)
		st.Fleet = append(st.Fleet, row)
	}

	bytes := map[string]int64{}
	for i, j := range jobs {
		if i >= maxJobsShown {
			break
		}
		v := Job{JobID: clip(j.JobID), Name: clip(j.Name), Kind: clip(j.Kind), State: clip(j.State), Codec: clip(j.Codec),
			Step: j.Step, Steps: j.Steps, TokensPerS: j.TokensPerS, BytesPerToken: j.BytesPerToken,
			Recoveries: j.Recoveries, Updated: j.Updated, Error: clip(j.Error), LossPoints: len(j.Loss)}
		if len(j.Stages) <= 64 {
			v.Stages = j.Stages
		}
		for codec, n := range j.BytesSent {
			v.BytesSent += n
			bytes[clip(codec)] += n
		}
		if n := len(j.Loss); n > 0 {
			last := j.Loss[n-1].Y
			v.LastLoss = &last
		}
		d.history.add(j.JobID, j.Step, j.TokensPerS)
		v.Chart = fmt.Sprintf("%d-%d-%d", j.Step, len(j.Loss), d.history.len(j.JobID))
		st.Jobs = append(st.Jobs, v)
	}
	for c, n := range bytes {
		st.Bytes = append(st.Bytes, CodecBytes{Codec: c, Bytes: n})
	}
	slices.SortFunc(st.Bytes, func(a, b CodecBytes) int {
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Codec, b.Codec)
	})
	for i, e := range board {
		if i >= maxLeaderRows {
			break
		}
		e.PeerID = clip(e.PeerID)
		st.Leaderboard = append(st.Leaderboard, e)
	}
	return st
}

// attested reads a TEE kind: none or empty is not attested; sim is, but
// insecurely.
func attested(tee string) (bool, bool) {
	switch strings.ToLower(tee) {
	case "", "none":
		return false, false
	case "sim":
		return true, true
	}
	return true, false
}

func clip(s string) string {
	if len(s) > maxStringOnPage {
		return s[:maxStringOnPage]
	}
	return s
}

func clipAll(ss []string, n int) []string {
	var out []string
	for i, s := range ss {
		if i >= n {
			break
		}
		out = append(out, clip(s))
	}
	return out
}

func (d *Dashboard) serveState(w http.ResponseWriter, r *http.Request) {
	_, b := d.state()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b)
}
