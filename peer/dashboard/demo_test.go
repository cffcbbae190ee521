package dashboard_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/ledger"
)

// swarmSource is a dashboard Source for a small swarm whose one job really
// trains: each Step takes an SGD step on a least-squares problem and
// records its loss, and the coordinator's real ledger issuer signs
// receipts that a real ledger verifies for the leaderboard. Time is a
// clock the test advances, one step per 250 ms.
type swarmSource struct {
	mu     sync.Mutex
	now    time.Time
	self   ident
	peers  []ident
	status api.Status
	job    api.JobStatus

	// The model: y = w·x + noise, fitted by SGD.
	rng       *rand.Rand
	truth, w  []float64
	lr        float64
	issuer    *ledger.Issuer
	ledger    *ledger.Ledger
	lastIssue time.Time
}

type ident struct {
	key crypto.PrivKey
	id  string
}

func newIdent(t testing.TB) ident {
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return ident{k, id.String()}
}

const (
	demoTerm       = 3
	tokensPerStep  = 4096
	demoStepTime   = 250 * time.Millisecond
	demoIssueEvery = 10 * time.Second
)

func newSwarmSource(t testing.TB) *swarmSource {
	s := &swarmSource{now: time.Date(2026, 11, 30, 20, 0, 0, 0, time.UTC), self: newIdent(t), rng: rand.New(rand.NewPCG(7, 11)), lr: 0.03}
	for range 4 {
		s.peers = append(s.peers, newIdent(t))
	}
	coord := s.peers[0]
	s.status = api.Status{
		PeerID: s.self.id, Swarm: "lab", Version: "dev", Reachability: "public", Backend: "cpu", TEE: "none",
		Addrs: []string{"/ip4/127.0.0.1/tcp/7600"},
		Peers: []api.PeerStatus{
			{PeerID: coord.id, Conn: "direct", Platform: "linux/amd64", Backend: "cpu", GFLOPS: 310, MemoryBytes: 16 << 30, TEE: "sim", Reachability: "public"},
			{PeerID: s.peers[1].id, Conn: "relayed", Platform: "darwin/arm64", Backend: "metal", GFLOPS: 2400, MemoryBytes: 24 << 30, TEE: "none", Reachability: "private", Relayed: true, RelayReason: "hole punch failed: both sides behind endpoint-dependent NAT"},
			{PeerID: s.peers[2].id, Conn: "direct", Platform: "linux/amd64", Backend: "cuda", GFLOPS: 38000, MemoryBytes: 20 << 30, TEE: "sim", Reachability: "public"},
			{PeerID: s.peers[3].id, Conn: "direct", Platform: "linux/arm64", Backend: "cpu", GFLOPS: 95, MemoryBytes: 8 << 30, TEE: "none", Reachability: "private"},
		},
		Coordinator: &api.Coordinator{PeerID: coord.id, Term: demoTerm, TEE: "sim", Insecure: true, LeaseExpires: s.now.Add(9 * time.Second)},
	}
	s.job = api.JobStatus{
		JobID: "job-7f3a", Name: "tiny-llama pretrain", Kind: "train", State: "running", Researcher: s.self.id,
		Codec: "lowrank", Steps: 400, BytesSent: map[string]int64{},
		Stages: []api.JobStage{
			{Index: 0, First: 0, Last: 0, Replicas: []string{s.self.id}, Path: "direct"},
			{Index: 1, First: 0, Last: 6, Replicas: []string{s.peers[1].id}, Path: "relayed"},
			{Index: 2, First: 6, Last: 16, Replicas: []string{s.peers[2].id, s.peers[3].id}, Path: "direct"},
		},
	}
	const d = 16
	s.truth, s.w = make([]float64, d), make([]float64, d)
	for i := range s.truth {
		s.truth[i] = s.rng.NormFloat64()
	}
	var err error
	if s.issuer, err = ledger.NewIssuer(coord.key, "lab", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if s.ledger, err = ledger.Open(t.TempDir(), "lab"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ledger.Close() })
	if err := s.ledger.RecordTerm(ledger.TermRecord{Term: demoTerm, Coordinator: coord.id, TEE: "sim", Insecure: true, AcceptedAt: s.now}); err != nil {
		t.Fatal(err)
	}
	s.lastIssue = s.now
	return s
}

// Step trains one step and advances the clock by one step time.
func (s *swarmSource) Step(t testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	const batch = 32
	grad := make([]float64, len(s.w))
	loss := 0.0
	for range batch {
		x := make([]float64, len(s.w))
		y := 0.3 * s.rng.NormFloat64()
		pred := 0.0
		for i := range x {
			x[i] = s.rng.NormFloat64()
			y += s.truth[i] * x[i]
			pred += s.w[i] * x[i]
		}
		e := pred - y
		loss += e * e / batch
		for i := range grad {
			grad[i] += 2 * e * x[i] / batch
		}
	}
	for i := range s.w {
		s.w[i] -= s.lr * grad[i]
	}
	stepTime := demoStepTime + time.Duration(math.Min(loss, 20)*float64(time.Millisecond))
	s.now = s.now.Add(stepTime)
	s.job.Step++
	s.job.Loss = append(s.job.Loss, api.Point{X: float64(s.job.Step), Y: loss})
	s.job.TokensPerS = tokensPerStep / stepTime.Seconds()
	s.job.BytesSent["lowrank"] += 2 * 2 * 64 * tokensPerStep // two boundaries, forward and back, k=64 fp16
	s.job.BytesSent["int8"] += tokensPerStep * 12
	s.job.BytesPerToken = float64(s.job.BytesSent["lowrank"]+s.job.BytesSent["int8"]) / float64(s.job.Step*tokensPerStep)
	s.job.Updated = s.now
	s.status.Coordinator.LeaseExpires = s.now.Add(9 * time.Second)

	s.issuer.Seen(s.self.id, s.now)
	for _, p := range s.peers {
		s.issuer.Seen(p.id, s.now)
	}
	from, to := int64(s.job.Step-1), int64(s.job.Step)
	s.issuer.Work(s.self.id, s.job.JobID, from, to, 0.2*stepTime.Seconds(), tokensPerStep)
	s.issuer.Work(s.peers[1].id, s.job.JobID, from, to, 0.7*stepTime.Seconds(), tokensPerStep)
	s.issuer.Work(s.peers[2].id, s.job.JobID, from, to, 0.3*stepTime.Seconds(), tokensPerStep/2)
	s.issuer.Work(s.peers[3].id, s.job.JobID, from, to, 0.9*stepTime.Seconds(), tokensPerStep/2)
	if s.now.Sub(s.lastIssue) >= demoIssueEvery {
		rs, err := s.issuer.Issue(demoTerm, s.now)
		if err != nil {
			t.Error(err)
		}
		for _, r := range rs {
			if _, err := s.ledger.Add(r); err != nil {
				t.Error(err)
			}
		}
		s.lastIssue = s.now
	}
}

func (s *swarmSource) Status() api.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	c := *st.Coordinator
	st.Coordinator = &c
	return st
}

func (s *swarmSource) Jobs() []api.JobStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.job
	j.Loss = append([]api.Point(nil), j.Loss...)
	j.BytesSent = map[string]int64{}
	for k, v := range s.job.BytesSent {
		j.BytesSent[k] = v
	}
	return []api.JobStatus{j}
}

func (s *swarmSource) Leaderboard() []api.LedgerEntry { return s.ledger.Leaderboard() }

// clock is the source's time, for the dashboard's lease countdown.
func (s *swarmSource) clock() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}
