package node

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/dashboard"
	"github.com/holopeer/holopeer/peer/ledger"
	"github.com/holopeer/holopeer/peer/metrics"
	"github.com/holopeer/holopeer/stage/job"
)

// What a node reports about the swarm: Prometheus metrics, the dashboard,
// and the contribution ledger. Every node keeps the receipts it hears and
// the terms its election accepted; the coordinator signs receipts.

// receiptUpdate is a jobs-topic payload carrying one signed receipt.
type receiptUpdate struct {
	Type    string          `json:"type"` // "receipt"
	Receipt json.RawMessage `json:"receipt"`
}

// openLedger opens the ledger and the metrics its refusals count. It runs
// before the services start: the coordinator checks takeovers against the
// ledger's term history.
func (n *Node) openLedger() error {
	var err error
	n.metrics = metrics.New(metrics.WithStatus(n.Status), metrics.WithJobs(n.Jobs))
	refused := func(reason string) { n.metrics.Refused("ledger", reason) }
	n.ledger, err = ledger.Open(n.cfg.DataDir, n.cfg.Swarm, ledger.WithLogger(n.log), ledger.WithRefusals(refused))
	return err
}

func (n *Node) startReporting() error {
	var err error
	if n.issuer, err = ledger.NewIssuer(n.host.PrivateKey(), n.cfg.Swarm, 0); err != nil {
		return err
	}
	if n.cfg.Dashboard {
		if n.dash, err = dashboard.New(n, dashboard.WithLogger(n.log)); err != nil {
			return err
		}
	}
	return nil
}

// Leaderboard is the verified contribution totals (dashboard.Source).
func (n *Node) Leaderboard() []api.LedgerEntry { return n.ledger.Leaderboard() }

// followElection records every term the election accepts (receipts are
// checked against this history) and keeps the metrics current.
func (n *Node) followElection(ctx context.Context) {
	var last uint64
	for c := range n.gossip.WatchCoordinator(ctx) {
		if c == nil || c.Term == last {
			continue
		}
		last = c.Term
		rec := ledger.TermRecord{Swarm: n.cfg.Swarm, Term: c.Term, Coordinator: c.PeerID.String(), TEE: c.TEE, Insecure: c.Insecure, AcceptedAt: time.Now().UTC()}
		if err := n.ledger.RecordTerm(rec); err != nil {
			n.log.Warn("could not record the term", "term", c.Term, "err", err)
		}
		n.metrics.SetCoordinator(c.PeerID.String(), c.Term, c.TEE, c.Insecure)
		if c.Self {
			// A new coordinator learns where earlier receipts ended, so no
			// step or hour is credited twice across terms.
			n.issuer.Resume(n.ledger.Store().Receipts(), n.ledger.History(), time.Now())
		}
	}
}

// countPresence tells the issuer who is present, from presence heartbeats.
func (n *Node) countPresence(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		now := time.Now()
		for id := range n.gossip.Presence() {
			n.issuer.Seen(id.String(), now)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// onWork is the coordinator's receipt issuing: a researcher reported what
// its stage nodes did up to a checkpoint; sign a receipt for each and
// gossip them.
func (n *Node) onWork(term uint64, jobID string, from, to uint64, work []job.WorkItem) {
	// The signed spec bounds what a work report may credit.
	for _, p := range n.coord.Jobs() {
		if p.JobID == jobID && p.Spec.Kind == job.KindTrain {
			n.issuer.LimitJob(jobID, ledger.JobLimit{
				TokensPerStep: int64(p.Spec.Microbatches) * int64(p.Spec.MicrobatchTokens()),
				LastStep:      int64(p.Spec.Steps),
			})
		}
	}
	for _, w := range work {
		n.issuer.Work(w.Peer, jobID, int64(from), int64(to), w.ComputeS, w.Tokens)
	}
	rs, err := n.issuer.Issue(term, time.Now())
	if err != nil {
		n.log.Warn("could not issue receipts", "err", err)
		return
	}
	for _, r := range rs {
		if _, err := n.ledger.Add(r); err != nil {
			n.log.Warn("own receipt refused", "err", err)
			continue
		}
		b, err := r.Encode()
		if err != nil {
			continue
		}
		payload, _ := json.Marshal(receiptUpdate{Type: "receipt", Receipt: b})
		if err := n.gossip.PublishJob(context.Background(), payload); err != nil {
			n.log.Debug("could not gossip a receipt", "err", err)
		}
	}
	if len(rs) > 0 {
		n.log.Info("signed contribution receipts", "job", jobID, "receipts", len(rs), "steps", to)
	}
}

// takeReceipt keeps a receipt another node gossiped, after checking it
// against the terms this node accepted.
func (n *Node) takeReceipt(author string, raw json.RawMessage) {
	r, err := ledger.CheckIncoming(raw, n.cfg.Swarm, author, n.ledger.History())
	if err != nil {
		n.metrics.Receipt("rejected")
		n.metrics.Refused("ledger", ledger.Reason(err))
		n.log.Debug("receipt refused", "from", author, "err", err)
		return
	}
	added, err := n.ledger.Add(r)
	switch {
	case errors.Is(err, ledger.ErrTermPending):
		n.metrics.Receipt("held")
	case err != nil:
		n.metrics.Receipt("rejected")
	case added:
		n.metrics.Receipt("kept")
	default:
		n.metrics.Receipt("duplicate")
	}
}

func (n *Node) closeReporting() error {
	var errs []error
	if n.dash != nil {
		n.dash.Close()
	}
	if n.ledger != nil {
		errs = append(errs, n.ledger.Close())
	}
	return errors.Join(errs...)
}

// Metrics is the node's Prometheus registry and counters.
func (n *Node) Metrics() *metrics.Metrics { return n.metrics }

// Ledger is the node's contribution ledger.
func (n *Node) Ledger() *ledger.Ledger { return n.ledger }
