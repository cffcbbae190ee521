package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// Every node keeps what it hears of the swarm's jobs: a researcher reports
// its own job's progress here, and the report travels on the gossip jobs
// topic to every other node, so any node's status and dashboard can show
// the swarm's jobs and their loss curves.

const (
	maxJobs      = 32   // jobs remembered
	maxLossPoint = 2000 // loss samples kept per job
	// maxOwners bounds the job ids remembered with their researcher after
	// the job itself is evicted, so a peer that pushes a job out with fake
	// ones does not then get to report under its id.
	maxOwners = 4096
)

// ErrNotOwner refuses a progress report on a job from a peer other than
// the researcher first heard reporting it.
var ErrNotOwner = errors.New("progress report from a peer that is not the job's researcher")

// jobUpdate is the jobs-topic payload: one progress report.
type jobUpdate struct {
	Type string         `json:"type"` // "progress"
	Job  *api.JobStatus `json:"job"`  // Loss holds only the newest points
}

type jobBook struct {
	mu   sync.Mutex
	jobs map[string]*api.JobStatus
	// owners binds each job id to the researcher first heard reporting
	// it; order is their arrival, for eviction.
	owners map[string]string
	order  []string
}

// merge records a report from peer from. A job id belongs to the first
// researcher that reports it: a report from anyone else (or naming anyone
// else) is refused, so no peer can relabel, fail or truncate the curve of
// another's job. Only the owner's own reports roll its curve back.
func (b *jobBook) merge(from string, st *api.JobStatus) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st.Researcher != from {
		return fmt.Errorf("%w: report names researcher %q", ErrNotOwner, st.Researcher)
	}
	if b.jobs == nil {
		b.jobs = map[string]*api.JobStatus{}
		b.owners = map[string]string{}
	}
	if owner, ok := b.owners[st.JobID]; ok && owner != from {
		return fmt.Errorf("%w: job %s belongs to %s", ErrNotOwner, st.JobID, owner)
	}
	if _, ok := b.owners[st.JobID]; !ok {
		if len(b.order) >= maxOwners {
			delete(b.owners, b.order[0])
			b.order = b.order[1:]
		}
		b.owners[st.JobID] = from
		b.order = append(b.order, st.JobID)
	}
	cur, ok := b.jobs[st.JobID]
	if !ok {
		if len(b.jobs) >= maxJobs {
			b.evictOldest()
		}
		cp := *st
		cp.Loss = slices.Clone(st.Loss)
		b.jobs[st.JobID] = &cp
		return nil
	}
	points := cur.Loss
	for _, p := range st.Loss {
		// A rollback re-runs steps: drop what lies at or after the first
		// point of the update.
		for len(points) > 0 && points[len(points)-1].X >= p.X {
			points = points[:len(points)-1]
		}
		points = append(points, p)
	}
	if len(points) > maxLossPoint {
		points = thin(points)
	}
	keep := *cur
	*cur = *st
	cur.Loss = points
	// A report that leaves a field out does not erase what earlier ones
	// said.
	if len(cur.BytesSent) == 0 {
		cur.BytesSent = keep.BytesSent
	}
	if len(cur.Stages) == 0 {
		cur.Stages = keep.Stages
	}
	return nil
}

// thin halves a long curve, keeping the newest point.
func thin(points []api.Point) []api.Point {
	out := make([]api.Point, 0, len(points)/2+1)
	for i := len(points) % 2; i < len(points); i += 2 {
		out = append(out, points[i])
	}
	return out
}

func (b *jobBook) evictOldest() {
	var oldest string
	var at time.Time
	for id, j := range b.jobs {
		if oldest == "" || j.Updated.Before(at) {
			oldest, at = id, j.Updated
		}
	}
	delete(b.jobs, oldest)
}

func (b *jobBook) list() []api.JobStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]api.JobStatus, 0, len(b.jobs))
	for _, j := range b.jobs {
		cp := *j
		cp.Loss = slices.Clone(j.Loss)
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b api.JobStatus) int { return b.Updated.Compare(a.Updated) })
	return out
}

// ReportJob records this node's own job progress and gossips it. Loss
// should hold the points since the previous report.
func (n *Node) ReportJob(ctx context.Context, st api.JobStatus) {
	st.Updated = time.Now().UTC()
	if err := n.jobs.merge(n.host.ID().String(), &st); err != nil {
		n.log.Warn("not reporting a job this node does not own", "job", st.JobID, "err", err)
		return
	}
	b, err := json.Marshal(jobUpdate{Type: "progress", Job: &st})
	if err != nil {
		return
	}
	if err := n.gossip.PublishJob(ctx, b); err != nil {
		n.log.Debug("could not gossip job progress", "err", err)
	}
}

// Jobs is what this node knows of the swarm's jobs, newest first.
func (n *Node) Jobs() []api.JobStatus { return n.jobs.list() }

// followJobs merges the progress other researchers gossip.
func (n *Node) followJobs(ctx context.Context) {
	for m := range n.gossip.SubscribeJobs(ctx) {
		if m.From == n.host.ID() {
			continue
		}
		var r receiptUpdate
		if err := json.Unmarshal(m.Payload, &r); err == nil && r.Type == "receipt" {
			n.takeReceipt(m.From.String(), r.Receipt)
			continue
		}
		if err := n.jobs.takeReport(m.From.String(), m.Payload); err != nil {
			n.log.Debug("refused a jobs-topic message", "from", m.From.ShortString(), "err", err)
		}
	}
}

// errNotProgress is a jobs-topic payload that is not a progress report.
var errNotProgress = errors.New("not a progress report")

// takeReport merges a gossiped progress report from peer from.
func (b *jobBook) takeReport(from string, payload []byte) error {
	var u jobUpdate
	if err := json.Unmarshal(payload, &u); err != nil || u.Type != "progress" || u.Job == nil || u.Job.JobID == "" {
		return errNotProgress
	}
	if len(u.Job.Loss) > 64 || len(u.Job.Stages) > 256 {
		return fmt.Errorf("progress report of %d points and %d stages", len(u.Job.Loss), len(u.Job.Stages))
	}
	return b.merge(from, u.Job)
}

func (n *Node) serveJobs(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, n.Jobs())
}
