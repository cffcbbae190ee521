package coord_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"

	"github.com/holopeer/holopeer/gossip/coord"
	"github.com/holopeer/holopeer/peer/ledger"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

const swarm = "hijack-test"

func newHost(t *testing.T) (host.Host, crypto.PrivKey) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, key
}

func testSpec() job.Spec {
	return job.Spec{
		JobID: job.NewJobID("victim"), Name: "victim", Kind: job.KindTrain,
		Model:    model.Config{Vocab: 257, Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 16},
		InitSeed: 1, Codec: "fp32", Stages: 2, Replicas: 1,
		Steps: 1000, SeqLen: 16, Rows: 2, Microbatches: 2,
		Optim: optim.DefaultConfig(), Schedule: optim.Schedule{Peak: 1e-3, Total: 1000},
	}
}

// swarmUnderTest is a researcher, two coordinators (A in term 1, B in
// term 2), two stage nodes with real stage runtimes and an attacker, each
// a real libp2p host; the term history is a real ledger history.
type swarmUnderTest struct {
	researcher, a, b, attacker host.Host
	aKey, bKey, attackerKey    crypto.PrivKey
	stages                     []host.Host
	runtimes                   []*pipeline.Runtime
	coordA, coordB             *coord.Service
	term                       atomic.Uint64 // the term now: 1 (A coordinates) or 2 (B)
}

func newSwarm(t *testing.T) *swarmUnderTest {
	t.Helper()
	s := &swarmUnderTest{}
	s.term.Store(1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.researcher, _ = newHost(t)
	s.a, s.aKey = newHost(t)
	s.b, s.bKey = newHost(t)
	s.attacker, s.attackerKey = newHost(t)
	for range 2 {
		h, _ := newHost(t)
		s.stages = append(s.stages, h)
	}
	all := append([]host.Host{s.researcher, s.a, s.b, s.attacker}, s.stages...)
	for _, x := range all {
		for _, y := range all {
			if x != y {
				x.Peerstore().AddAddrs(y.ID(), y.Addrs(), time.Hour)
			}
		}
	}
	hist, err := ledger.OpenHistory(t.TempDir()+"/terms.jsonl", swarm)
	if err != nil {
		t.Fatal(err)
	}
	for term, c := range map[uint64]host.Host{1: s.a, 2: s.b} {
		if err := hist.Record(ledger.TermRecord{Swarm: swarm, Term: term, Coordinator: c.ID().String(), AcceptedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// Stages take a plan only from the coordinator of its term, and only
	// from the term now (the fencing token).
	check := func(_ context.Context, p *job.Plan) error {
		c, ok := hist.CoordinatorOf(p.Term)
		if !ok || c != p.Coordinator || p.Term != s.term.Load() {
			return errors.New("plan not from the coordinator of the current term")
		}
		return nil
	}
	for _, h := range s.stages {
		rt, err := pipeline.NewRuntime(pipeline.RuntimeConfig{Host: h, Check: check, Memory: 1 << 30, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		s.runtimes = append(s.runtimes, rt)
	}
	offers := func() []coord.Offer {
		var out []coord.Offer
		for _, h := range s.stages {
			out = append(out, coord.Offer{PeerID: h.ID().String(), GFLOPS: 10, MemoryBytes: 1 << 30, Backend: "cpu"})
		}
		return out
	}
	mk := func(h host.Host, key crypto.PrivKey, term uint64) *coord.Service {
		svc, err := coord.New(coord.Config{
			Host: h, Key: key, Logger: log, Terms: hist, Offers: offers,
			Term:  func() (uint64, bool) { return term, s.term.Load() == term },
			Alive: func(peer.ID) bool { return true },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { svc.Close() })
		return svc
	}
	s.coordA, s.coordB = mk(s.a, s.aKey, 1), mk(s.b, s.bKey, 2)
	return s
}

func (s *swarmUnderTest) client(h host.Host, coordinator host.Host, current []byte) *coord.Client {
	return &coord.Client{
		Host:        h,
		Coordinator: func(context.Context) (peer.ID, error) { return coordinator.ID(), nil },
		Current:     func(string) []byte { return current },
	}
}

// send writes one raw request to a coordinator, as an attacker would.
func send(ctx context.Context, from, to host.Host, req coord.Request) (coord.Reply, error) {
	st, err := from.NewStream(ctx, to.ID(), coord.JobProtocol)
	if err != nil {
		return coord.Reply{}, err
	}
	defer st.Close()
	b, _ := json.Marshal(req)
	if err := msgio.NewVarintWriter(st).WriteMsg(b); err != nil {
		return coord.Reply{}, err
	}
	rb, err := msgio.NewVarintReaderSize(st, 4<<20).ReadMsg()
	if err != nil {
		return coord.Reply{}, err
	}
	var r coord.Reply
	return r, json.Unmarshal(rb, &r)
}

// selfSigned is the attacker's plan: a copy of the victim's job (its id,
// spec and stages) that names the attacker researcher and coordinator,
// signed by the attacker in term, with a spec the attacker signed.
func (s *swarmUnderTest) selfSigned(t *testing.T, victim *job.Plan, term, epoch uint64) []byte {
	t.Helper()
	p := *victim
	me := s.attacker.ID().String()
	p.Researcher, p.Coordinator, p.Term, p.Epoch = me, me, term, epoch
	ss, err := job.SignSpec(&p.Spec, s.attackerKey)
	if err != nil {
		t.Fatal(err)
	}
	p.SignedSpec = ss
	b, err := job.SignPlan(&p, s.attackerKey)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stealShard is the exfiltration step: the attacker links with stage 0
// for the job's current placement, which only the plan's researcher and
// neighbours may; a link would let it ask for opShard (weights and AdamW
// state) or push opRestore.
func (s *swarmUnderTest) stealShard(ctx context.Context, p *job.Plan) error {
	c, err := codec.New(codec.FP32, codec.Params{Dim: p.Spec.Model.Dim})
	if err != nil {
		return err
	}
	auth := wire.AuthorizerFunc(func(context.Context, wire.JobID, peer.ID) (wire.LinkSpec, error) {
		return wire.LinkSpec{Codec: c, Accept: wire.Kinds(wire.KindBackward)}, nil
	})
	svc, err := wire.NewService(s.attacker, auth)
	if err != nil {
		return err
	}
	defer svc.Close()
	target, _ := peer.Decode(p.Stages[0].Replicas[0])
	l, err := svc.OpenLink(ctx, target, pipeline.WireJob(p.JobID, p.Gen))
	if err == nil {
		l.Close()
		return errors.New("stage 0 linked with the attacker")
	}
	return err
}

// TestHijackJobAfterCoordinatorChange performs the hijack of issue 16
// finding 1: after the coordinator changes, a swarm peer sends the new
// coordinator a replan carrying a self-signed copy of the victim's plan
// that names it researcher, at epoch 101; then it links with stage 0 to
// take the shard. Every step must be refused, and the genuine researcher
// must still be able to hand its job to the new coordinator.
func TestHijackJobAfterCoordinatorChange(t *testing.T) {
	s := newSwarm(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	signed, err := s.client(s.researcher, s.a, nil).Submit(ctx, testSpec())
	if err != nil {
		t.Fatal(err)
	}
	victim, err := job.OpenPlan(signed)
	if err != nil {
		t.Fatal(err)
	}
	if victim.Researcher != s.researcher.ID().String() {
		t.Fatalf("plan names researcher %s", victim.Researcher)
	}

	s.term.Store(2) // A steps down; B knows no job

	// The hijack, in the term of each coordinator: its plan opens (it
	// signed it) but its signer coordinated no term.
	for _, term := range []uint64{1, 2} {
		r, err := send(ctx, s.attacker, s.b, coord.Request{Op: "replan", JobID: victim.JobID, Epoch: 100, Plan: s.selfSigned(t, victim, term, 100)})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.Err, coord.ErrUntrustedPlan.Error()) {
			t.Fatalf("self-signed takeover in term %d: reply %+v, want %v", term, r, coord.ErrUntrustedPlan)
		}
	}
	// The victim's genuine plan, replayed by the attacker (a stage node
	// holds it): it names another researcher.
	if r, _ := send(ctx, s.attacker, s.b, coord.Request{Op: "replan", JobID: victim.JobID, Epoch: 100, Plan: signed}); !strings.Contains(r.Err, coord.ErrNotResearcher.Error()) {
		t.Fatalf("replayed plan: reply %+v", r)
	}
	if n := len(s.coordB.Jobs()); n != 0 {
		t.Fatalf("B took over %d jobs from the attacker", n)
	}

	// The genuine researcher hands its job to B.
	next, err := s.client(s.researcher, s.b, signed).Replan(ctx, victim.JobID, victim.Epoch, "", 0)
	if err != nil {
		t.Fatalf("genuine takeover: %v", err)
	}
	p2, err := job.OpenPlan(next)
	if err != nil || p2.Term != 2 || p2.Coordinator != s.b.ID().String() || p2.Researcher != victim.Researcher {
		t.Fatalf("genuine takeover: %v %+v", err, p2)
	}
	// Now B knows the job: the attacker is not its researcher.
	if r, _ := send(ctx, s.attacker, s.b, coord.Request{Op: "replan", JobID: victim.JobID, Epoch: 101, Plan: s.selfSigned(t, victim, 2, 101)}); !strings.Contains(r.Err, coord.ErrNotResearcher.Error()) {
		t.Fatalf("replan of a known job by the attacker: reply %+v", r)
	}

	// A hostile (or buggy) coordinator of the current term re-signs the
	// job for the attacker: its own signed spec of the same job id, epoch
	// 101. The stage nodes refuse it, as they do a changed span.
	evil := *p2
	evil.Researcher, evil.Epoch = s.attacker.ID().String(), 101
	if evil.SignedSpec, err = job.SignSpec(&evil.Spec, s.attackerKey); err != nil {
		t.Fatal(err)
	}
	evilSigned, err := job.SignPlan(&evil, s.bKey)
	if err != nil {
		t.Fatal(err)
	}
	respan := *p2
	respan.Epoch = 102
	respan.Stages = []job.StagePlan{
		{Index: 0, First: 0, Last: 1, Replicas: p2.Stages[0].Replicas},
		{Index: 1, First: 1, Last: 2, Replicas: p2.Stages[1].Replicas},
	}
	if p2.Stages[0].Last == 1 {
		respan.Stages = []job.StagePlan{{Index: 0, First: 0, Last: 2, Replicas: p2.Stages[0].Replicas}}
	}
	respanSigned, err := job.SignPlan(&respan, s.bKey)
	if err != nil {
		t.Fatal(err)
	}
	for i, rt := range s.runtimes {
		for name, b := range map[string][]byte{"researcher": evilSigned, "spans": respanSigned} {
			if err := rt.Assign(ctx, b, s.b.ID()); !errors.Is(err, pipeline.ErrRefused) || !strings.Contains(err.Error(), job.ErrJobChanged.Error()) {
				t.Fatalf("stage node %d took a plan that changes the %s: %v", i, name, err)
			}
		}
	}

	// The exfiltration: stage 0 does not link with the attacker.
	if err := s.stealShard(ctx, p2); !errors.Is(err, wire.ErrNotAuthorized) {
		t.Fatalf("attacker's link to stage 0: %v, want a not-authorized refusal", err)
	}
}

// TestSelfSignedReplanSkipsPlacement performs finding 9b: replans with
// self-signed plans, one per fake job, each naming the same stage nodes,
// to stack jobs on them past the one-job-per-node placement and their
// lend. The coordinator must refuse every one and the nodes must hold
// only the job the coordinator placed.
func TestSelfSignedReplanSkipsPlacement(t *testing.T) {
	s := newSwarm(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signed, err := s.client(s.researcher, s.a, nil).Submit(ctx, testSpec())
	if err != nil {
		t.Fatal(err)
	}
	victim, _ := job.OpenPlan(signed)
	for i := range 4 {
		fake := *victim
		fake.Spec.JobID = job.NewJobID("squat")
		fake.JobID = fake.Spec.JobID
		b := s.selfSigned(t, &fake, 1, 1)
		r, err := send(ctx, s.attacker, s.a, coord.Request{Op: "replan", JobID: fake.JobID, Plan: b})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.Err, coord.ErrUntrustedPlan.Error()) {
			t.Fatalf("self-signed replan %d: reply %+v, want %v", i, r, coord.ErrUntrustedPlan)
		}
	}
	if n := len(s.coordA.Jobs()); n != 1 {
		t.Fatalf("the coordinator holds %d jobs, want the 1 it placed", n)
	}
	for i, rt := range s.runtimes {
		if jobs := rt.Jobs(); len(jobs) != 1 || jobs[0] != victim.JobID {
			t.Fatalf("stage node %d runs %v, want only %s", i, jobs, victim.JobID)
		}
	}
	// And a submit whose spec another key signed is refused outright.
	ss, err := job.SignSpec(&victim.Spec, s.attackerKey)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := send(ctx, s.researcher, s.a, coord.Request{Op: "submit", SignedSpec: ss}); !strings.Contains(r.Err, coord.ErrNotResearcher.Error()) {
		t.Fatalf("submit of a spec signed by another key: reply %+v", r)
	}
}

// TestTakeoverOntoBusyNodes: a genuine plan of an earlier term is not
// adopted onto nodes the new coordinator already placed another job on,
// which would stack two jobs on each node behind placement's back.
func TestTakeoverOntoBusyNodes(t *testing.T) {
	s := newSwarm(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := s.client(s.researcher, s.a, nil).Submit(ctx, testSpec())
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := job.OpenPlan(first)
	s.term.Store(2)
	other, _ := newHost(t)
	for _, h := range append([]host.Host{s.b}, s.stages...) {
		other.Peerstore().AddAddrs(h.ID(), h.Addrs(), time.Hour)
		h.Peerstore().AddAddrs(other.ID(), other.Addrs(), time.Hour)
	}
	// B does not know the first job and places a second on the same nodes.
	if _, err := s.client(other, s.b, nil).Submit(ctx, testSpec()); err != nil {
		t.Fatal(err)
	}
	_, err = s.client(s.researcher, s.b, first).Replan(ctx, p1.JobID, p1.Epoch, "", 0)
	if err == nil || !strings.Contains(err.Error(), coord.ErrNodesBusy.Error()) {
		t.Fatalf("takeover onto busy nodes: %v, want %v", err, coord.ErrNodesBusy)
	}
	if n := len(s.coordB.Jobs()); n != 1 {
		t.Fatalf("B holds %d jobs, want 1", n)
	}
}
