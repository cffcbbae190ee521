package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// stateCollector produces the gauges that describe the node's present
// state, read at scrape time (pull) or from the last pushed values.
type stateCollector Metrics

var (
	descPeers = prometheus.NewDesc(Namespace+"_peers",
		"Swarm members this node is connected to, by connection type (direct, relayed).", []string{"conn"}, nil)
	descTerm = prometheus.NewDesc(Namespace+"_election_term",
		"The election term of the coordinator this node follows (0 for none).", nil, nil)
	descCoordinator = prometheus.NewDesc(Namespace+"_coordinator_info",
		"The coordinator this node follows (value 1); insecure=\"true\" for sim attestation, testnets only.", []string{"peer_id", "tee", "insecure"}, nil)
	descNode = prometheus.NewDesc(Namespace+"_node_info",
		"This node (value 1).", []string{"peer_id", "swarm", "version", "backend", "tee", "reachability"}, nil)
	descTokensPerS = prometheus.NewDesc(Namespace+"_job_tokens_per_second",
		"A job's training or serving throughput in tokens per second.", []string{"job"}, nil)
	descJobStep = prometheus.NewDesc(Namespace+"_job_step",
		"A job's last completed step.", []string{"job"}, nil)
	descJobLoss = prometheus.NewDesc(Namespace+"_job_loss",
		"A job's latest training loss.", []string{"job"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPeers, descTerm, descCoordinator, descNode, descTokensPerS, descJobStep, descJobLoss} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	m := (*Metrics)(c)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		if cm, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...); err == nil {
			ch <- cm
		}
	}
	peers := map[string]int{"direct": 0, "relayed": 0}
	var (
		haveCoord           bool
		coordPeer, coordTEE string
		coordTerm           uint64
		coordInsecure       bool
	)
	if m.status != nil {
		st := m.status()
		for _, p := range st.Peers {
			peers[clipLabel(p.Conn)]++
		}
		gauge(descNode, 1, clipLabel(st.PeerID), clipLabel(st.Swarm), clipLabel(st.Version), clipLabel(st.Backend), clipLabel(st.TEE), clipLabel(st.Reachability))
		if co := st.Coordinator; co != nil {
			haveCoord, coordPeer, coordTerm, coordTEE, coordInsecure = true, co.PeerID, co.Term, co.TEE, co.Insecure
		}
		m.mu.Lock()
		if haveCoord {
			m.noteCoordinator(coordPeer, coordTerm)
		}
		m.mu.Unlock()
	} else {
		m.mu.Lock()
		for k, v := range m.peers {
			peers[k] = v
		}
		haveCoord, coordPeer, coordTerm, coordTEE, coordInsecure = m.haveCoord, m.coordPeer, m.coordTerm, m.coordTEE, m.coordInsec
		m.mu.Unlock()
	}
	for conn, n := range peers {
		gauge(descPeers, float64(n), conn)
	}
	gauge(descTerm, float64(coordTerm))
	if haveCoord && coordPeer != "" {
		gauge(descCoordinator, 1, clipLabel(coordPeer), clipLabel(coordTEE), strconv.FormatBool(coordInsecure))
	}

	if m.jobs != nil {
		seen := map[string]bool{}
		for _, j := range m.jobs() {
			id := clipLabel(j.JobID)
			if seen[id] || len(seen) >= MaxJobs {
				continue
			}
			seen[id] = true
			gauge(descTokensPerS, j.TokensPerS, id)
			gauge(descJobStep, float64(j.Step), id)
			if n := len(j.Loss); n > 0 {
				gauge(descJobLoss, j.Loss[n-1].Y, id)
			}
		}
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, v := range m.tokensPerS {
		gauge(descTokensPerS, v, id)
	}
}
