package ledger

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Issuer is the coordinator's side of the ledger. It accumulates what each
// peer did since its last receipt (presence from heartbeats, work from job
// progress) and, at each checkpoint interval, signs one receipt per peer
// and job. It never credits the same steps or time twice: periods start
// where the peer's last receipt ended, steps at the last step credited, and
// Resume teaches a new coordinator where the receipts of earlier terms
// ended. Safe for concurrent use.
type Issuer struct {
	key   crypto.PrivKey
	id    string
	swarm string
	grace time.Duration

	mu     sync.Mutex // guards peers and limits
	peers  map[string]*peerTally
	limits map[string]JobLimit
}

// JobLimit is what a job's signed spec says one report of its work can
// hold: the issuer credits no step past LastStep and no more tokens than
// TokensPerStep for each step. Zero fields bound nothing.
type JobLimit struct {
	TokensPerStep int64 // tokens one stage processes in a step (microbatches × rows × seq_len)
	LastStep      int64 // the job's final step (steps are numbered from 1)
}

// MaxTokensPerComputeS caps the tokens credited per second of compute
// claimed, whatever the job: about a million a second, far beyond what
// one stage of the models holopeer runs processes. Work reports come from
// the job's researcher, who could otherwise claim any count; with a
// JobLimit the signed spec bounds them more tightly.
const MaxTokensPerComputeS = 1 << 20

// resumeSlack is how far past now a stored receipt's period may end and
// still be believed by Resume (clock skew between nodes).
const resumeSlack = time.Minute

type peerTally struct {
	periodStart time.Time // end of the last receipt's period, or the first sighting
	lastSeen    time.Time
	presence    time.Duration
	jobs        map[string]*jobTally
}

type jobTally struct {
	credited int64 // steps [0, credited) already have receipts
	from, to int64 // steps done since
	computeS float64
	tokens   int64
}

// DefaultPresenceGrace is the longest gap between two sightings of a peer
// that still counts as present: a few presence heartbeats.
const DefaultPresenceGrace = 30 * time.Second

// NewIssuer returns the issuer of a coordinator whose identity key is key.
// grace is the longest gap between sightings counted as presence (0 takes
// DefaultPresenceGrace).
func NewIssuer(key crypto.PrivKey, swarm string, grace time.Duration) (*Issuer, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("ledger: issuer: %w", err)
	}
	if grace <= 0 {
		grace = DefaultPresenceGrace
	}
	return &Issuer{key: key, id: id.String(), swarm: swarm, grace: grace, peers: map[string]*peerTally{}, limits: map[string]JobLimit{}}, nil
}

func (is *Issuer) tally(p string) *peerTally {
	t := is.peers[p]
	if t == nil {
		t = &peerTally{jobs: map[string]*jobTally{}}
		is.peers[p] = t
	}
	return t
}

// Seen records a sighting of peer (a presence heartbeat) at time at. The
// time since its previous sighting counts as presence when it is within
// the grace period.
func (is *Issuer) Seen(p string, at time.Time) {
	is.mu.Lock()
	defer is.mu.Unlock()
	t := is.tally(p)
	if t.periodStart.IsZero() {
		t.periodStart = at
	}
	if !t.lastSeen.IsZero() && at.After(t.lastSeen) && at.Sub(t.lastSeen) <= is.grace {
		from := t.lastSeen
		if from.Before(t.periodStart) {
			from = t.periodStart
		}
		if at.After(from) {
			t.presence += at.Sub(from)
		}
	}
	if at.After(t.lastSeen) {
		t.lastSeen = at
	}
}

// LimitJob bounds the work credited for job by its signed spec (see
// JobLimit). Call it before Work; it applies to later reports.
func (is *Issuer) LimitJob(job string, l JobLimit) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.limits[job] = l
}

// ForgetJob drops a finished job's limit.
func (is *Issuer) ForgetJob(job string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	delete(is.limits, job)
}

// Work credits peer with job steps [fromStep, toStep), computeS seconds of
// compute and tokens processed, as its progress reports say. Steps already
// credited are cut off, with their share of compute and tokens. Tokens
// are capped by MaxTokensPerComputeS and the job's JobLimit; compute by
// the wall-clock time a receipt covers (Issue).
func (is *Issuer) Work(p, job string, fromStep, toStep int64, computeS float64, tokens int64) {
	if job == "" || toStep <= fromStep || math.IsNaN(computeS) || math.IsInf(computeS, 0) || computeS < 0 || tokens < 0 {
		return
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	lim := is.limits[job]
	if lim.LastStep > 0 && toStep > lim.LastStep+1 {
		if fromStep > lim.LastStep {
			return
		}
		keep := float64(lim.LastStep+1-fromStep) / float64(toStep-fromStep)
		computeS *= keep
		tokens = int64(float64(tokens) * keep)
		toStep = lim.LastStep + 1
	}
	tokens = min(tokens, tokenCap(toStep-fromStep, computeS, lim))
	t := is.tally(p)
	j := t.jobs[job]
	if j == nil {
		j = &jobTally{}
		t.jobs[job] = j
	}
	floor := max(j.credited, j.to)
	if toStep <= floor {
		return
	}
	if fromStep < floor {
		keep := float64(toStep-floor) / float64(toStep-fromStep)
		computeS *= keep
		tokens = int64(float64(tokens) * keep)
		fromStep = floor
	}
	if j.to == 0 && j.from == 0 {
		j.from = fromStep
	}
	j.to = toStep
	j.computeS += computeS
	j.tokens = min(j.tokens+tokens, MaxTokens)
}

// tokenCap is the most tokens one report of steps steps and computeS
// seconds may credit.
func tokenCap(steps int64, computeS float64, lim JobLimit) int64 {
	c := int64(min(math.Ceil(max(computeS, 1)*MaxTokensPerComputeS), float64(MaxTokens)))
	if lim.TokensPerStep > 0 && steps > 0 {
		if steps > MaxTokens/lim.TokensPerStep {
			return c
		}
		c = min(c, steps*lim.TokensPerStep)
	}
	return c
}

// Resume learns from receipts already issued (by earlier terms, or before
// a restart) where each peer's credit ends. It uses only receipts that
// verify: well-formed, of this swarm, signed by the coordinator terms
// records for their term, and not ending in the future. So a forged or
// doctored receipt in the store, or one of a term this node never
// accepted, cannot move a peer's credit on and deny it what it earns. It
// returns how many receipts it used.
func (is *Issuer) Resume(receipts []Receipt, terms TermHistory, now time.Time) int {
	if terms == nil {
		return 0
	}
	used := 0
	for _, r := range receipts {
		if r.Swarm != is.swarm || r.Validate() != nil {
			continue
		}
		if c, ok := terms.CoordinatorOf(r.Term); !ok || c != r.Coordinator {
			continue
		}
		if r.PeriodEnd.After(now.Add(resumeSlack)) || r.IssuedAt.After(now.Add(resumeSlack)) {
			continue
		}
		if r.CheckSignature() != nil {
			continue
		}
		is.mu.Lock()
		t := is.tally(r.Peer)
		if r.PeriodEnd.After(t.periodStart) {
			t.periodStart = r.PeriodEnd
		}
		if r.JobID != "" {
			j := t.jobs[r.JobID]
			if j == nil {
				j = &jobTally{}
				t.jobs[r.JobID] = j
			}
			j.credited = max(j.credited, r.ToStep)
		}
		is.mu.Unlock()
		used++
	}
	return used
}

// Issue signs, for term, a receipt for each peer and job with anything
// since the peer's last receipt, covering the period up to now: one per
// job with work (the first also carrying the peer's presence) or one of
// presence alone.
func (is *Issuer) Issue(term uint64, now time.Time) ([]Receipt, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	var out []Receipt
	peers := make([]string, 0, len(is.peers))
	for p := range is.peers {
		peers = append(peers, p)
	}
	slices.Sort(peers)
	for _, p := range peers {
		t := is.peers[p]
		if t.periodStart.IsZero() || !now.After(t.periodStart) {
			continue
		}
		start := t.periodStart
		if now.Sub(start) > MaxPeriod {
			start = now.Add(-MaxPeriod)
		}
		period := now.Sub(start).Seconds()
		presence := min(t.presence.Seconds(), period)
		jobs := make([]string, 0, len(t.jobs))
		for id, j := range t.jobs {
			if j.to > max(j.from, j.credited) {
				jobs = append(jobs, id)
			}
		}
		slices.Sort(jobs)
		base := Receipt{Swarm: is.swarm, Term: term, Peer: p, PeriodStart: start, PeriodEnd: now, IssuedAt: now}
		var rs []Receipt
		for _, id := range jobs {
			j := t.jobs[id]
			r := base
			r.JobID, r.FromStep, r.ToStep = id, j.from, j.to
			r.ComputeS, r.Tokens = min(j.computeS, period), min(j.tokens, MaxTokens)
			rs = append(rs, r)
		}
		if presence > 0 {
			if len(rs) > 0 {
				rs[0].PresenceS = presence
			} else {
				r := base
				r.PresenceS = presence
				rs = append(rs, r)
			}
		}
		for _, r := range rs {
			signed, err := Sign(r, is.key)
			if err != nil {
				return out, fmt.Errorf("ledger: issue for %s: %w", p, err)
			}
			out = append(out, signed)
		}
		t.periodStart, t.presence = now, 0
		for _, id := range jobs {
			j := t.jobs[id]
			j.credited, j.from, j.to, j.computeS, j.tokens = j.to, 0, 0, 0, 0
		}
	}
	return out, nil
}
