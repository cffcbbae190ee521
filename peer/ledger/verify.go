package ledger

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// Rejection is a receipt Verify did not count, and why.
type Rejection struct {
	Hash        Hash
	Peer        string
	Term        uint64
	Coordinator string
	JobID       string
	Err         error // wraps one of the package's Err… sentinels
}

// MarshalJSON writes the reason as text.
func (r Rejection) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Hash        string `json:"hash"`
		Peer        string `json:"peer"`
		Term        uint64 `json:"term"`
		Coordinator string `json:"coordinator"`
		JobID       string `json:"job,omitempty"`
		Reason      string `json:"reason"`
	}{r.Hash.String(), r.Peer, r.Term, r.Coordinator, r.JobID, r.Err.Error()})
}

// Report is what Verify found: each peer's total over the receipts it
// counted (most points first) and the receipts it rejected.
type Report struct {
	Swarm         string            `json:"swarm"`
	Receipts      int               `json:"receipts"` // looked at
	Accepted      int               `json:"accepted"`
	Totals        []api.LedgerEntry `json:"totals"`
	Rejected      []Rejection       `json:"rejected"`
	InsecureTerms []uint64          `json:"insecure_terms,omitempty"` // terms whose coordinator attested with sim: testnet credit only
}

// Entry returns one peer's total.
func (r Report) Entry(peerID string) (api.LedgerEntry, bool) {
	for _, e := range r.Totals {
		if e.PeerID == peerID {
			return e, true
		}
	}
	return api.LedgerEntry{}, false
}

// Top is the n peers with the most points (all for n <= 0).
func (r Report) Top(n int) []api.LedgerEntry { return Top(r.Totals, n) }

// Top sorts entries by points (most first, ties by peer id) and keeps n
// (all for n <= 0). It does not change its argument.
func Top(entries []api.LedgerEntry, n int) []api.LedgerEntry {
	out := slices.Clone(entries)
	slices.SortFunc(out, func(a, b api.LedgerEntry) int {
		if c := cmp.Compare(b.Points, a.Points); c != 0 {
			return c
		}
		return cmp.Compare(a.PeerID, b.PeerID)
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Verify checks receipts against swarm and the coordinator history and
// totals what it accepts; see the package comment for the rules.
func Verify(swarm string, receipts []Receipt, terms TermHistory) Report {
	return NewVerifier().Verify(swarm, receipts, terms)
}

// Verifier is Verify with a memory of signatures already checked, so a
// node that re-verifies its growing store each time its leaderboard is
// read checks each signature once. Safe for concurrent use.
type Verifier struct {
	mu     sync.Mutex
	sigOK  map[Hash]string // hash → signature that checked out
	maxMem int
}

// NewVerifier returns a Verifier with an empty signature memory.
func NewVerifier() *Verifier {
	return &Verifier{sigOK: map[Hash]string{}, maxMem: 4 * DefaultMaxReceipts}
}

func (v *Verifier) checkSignature(r Receipt, h Hash) error {
	v.mu.Lock()
	sig, ok := v.sigOK[h]
	v.mu.Unlock()
	if ok && sig == string(r.Sig) {
		return nil
	}
	if err := r.CheckSignature(); err != nil {
		return err
	}
	v.mu.Lock()
	if len(v.sigOK) >= v.maxMem {
		clear(v.sigOK)
	}
	v.sigOK[h] = string(r.Sig)
	v.mu.Unlock()
	return nil
}

// interval is a half-open range [lo, hi).
type interval struct{ lo, hi int64 }

// intervals is a sorted set of disjoint intervals.
type intervals []interval

// insert adds iv unless it overlaps one already held.
func (s *intervals) insert(iv interval) bool {
	i, _ := slices.BinarySearchFunc(*s, iv.lo, func(e interval, lo int64) int { return cmp.Compare(e.lo, lo) })
	if i > 0 && (*s)[i-1].hi > iv.lo {
		return false
	}
	if i < len(*s) && (*s)[i].lo < iv.hi {
		return false
	}
	*s = slices.Insert(*s, i, iv)
	return true
}

type jobKey struct{ peer, job string }

// Verify checks receipts against swarm and terms and totals what it
// accepts. The result does not depend on the order of receipts.
func (v *Verifier) Verify(swarm string, receipts []Receipt, terms TermHistory) Report {
	rep := Report{Swarm: swarm, Receipts: len(receipts), Totals: []api.LedgerEntry{}, Rejected: []Rejection{}}
	type item struct {
		r Receipt
		h Hash
	}
	items := make([]item, len(receipts))
	for i, r := range receipts {
		items[i] = item{r, r.Hash()}
	}
	// A canonical order, so that which of two overlapping receipts counts
	// is the same for every verifier: the earlier issued, then the lower
	// term, then the lower hash.
	slices.SortFunc(items, func(a, b item) int {
		if c := a.r.IssuedAt.Compare(b.r.IssuedAt); c != 0 {
			return c
		}
		if c := cmpUint(a.r.Term, b.r.Term); c != 0 {
			return c
		}
		return bytes.Compare(a.h[:], b.h[:])
	})

	seen := map[Hash]bool{}
	steps := map[jobKey]*intervals{}
	presence := map[string]*intervals{}
	totals := map[string]*api.LedgerEntry{}
	insecure := map[uint64]bool{}
	type insecureTerms interface {
		Term(uint64) (TermRecord, bool)
	}
	ins, _ := terms.(insecureTerms)

	for _, it := range items {
		r, h := it.r, it.h
		reject := func(err error) {
			rep.Rejected = append(rep.Rejected, Rejection{Hash: h, Peer: r.Peer, Term: r.Term, Coordinator: r.Coordinator, JobID: r.JobID, Err: err})
		}
		if err := r.Validate(); err != nil {
			reject(err)
			continue
		}
		if r.Swarm != swarm {
			reject(fmt.Errorf("%w: %q", ErrOtherSwarm, r.Swarm))
			continue
		}
		if err := v.checkSignature(r, h); err != nil {
			reject(err)
			continue
		}
		coord, ok := "", false
		if terms != nil {
			coord, ok = terms.CoordinatorOf(r.Term)
		}
		if !ok {
			reject(fmt.Errorf("%w: term %d", ErrUnknownTerm, r.Term))
			continue
		}
		if coord != r.Coordinator {
			reject(fmt.Errorf("%w: term %d was coordinated by %s, receipt signed by %s", ErrNotCoordinator, r.Term, coord, r.Coordinator))
			continue
		}
		if seen[h] {
			reject(ErrDuplicate)
			continue
		}
		seen[h] = true
		if r.JobID != "" {
			k := jobKey{r.Peer, r.JobID}
			if steps[k] == nil {
				steps[k] = &intervals{}
			}
			if !steps[k].insert(interval{r.FromStep, r.ToStep}) {
				reject(fmt.Errorf("%w: steps [%d, %d) of job %s credited again", ErrOverlap, r.FromStep, r.ToStep, r.JobID))
				continue
			}
		}
		if r.PresenceS > 0 {
			if presence[r.Peer] == nil {
				presence[r.Peer] = &intervals{}
			}
			if !presence[r.Peer].insert(interval{r.PeriodStart.UnixNano(), r.PeriodEnd.UnixNano()}) {
				// Undo the step claim: the receipt counts whole or not at all.
				if r.JobID != "" {
					steps[jobKey{r.Peer, r.JobID}].remove(interval{r.FromStep, r.ToStep})
				}
				reject(fmt.Errorf("%w: presence %s to %s credited again", ErrOverlap, r.PeriodStart.Format(time.RFC3339), r.PeriodEnd.Format(time.RFC3339)))
				continue
			}
		}
		e := totals[r.Peer]
		if e == nil {
			e = &api.LedgerEntry{PeerID: r.Peer}
			totals[r.Peer] = e
		}
		e.Points += Points(r)
		e.PresenceS += r.PresenceS
		e.ComputeS += r.ComputeS
		e.Tokens += r.Tokens
		e.Receipts++
		rep.Accepted++
		if ins != nil {
			if t, ok := ins.Term(r.Term); ok && t.Insecure {
				insecure[r.Term] = true
			}
		}
	}
	for _, e := range totals {
		rep.Totals = append(rep.Totals, *e)
	}
	rep.Totals = Top(rep.Totals, 0)
	for t := range insecure {
		rep.InsecureTerms = append(rep.InsecureTerms, t)
	}
	slices.Sort(rep.InsecureTerms)
	return rep
}

func (s *intervals) remove(iv interval) {
	if i := slices.Index(*s, iv); i >= 0 {
		*s = slices.Delete(*s, i, i+1)
	}
}

// ReadReceipts reads JSON-lines receipts from r (a store file, or the
// node's /v1/ledger/receipts), at most max of them. Lines that are not
// receipts are skipped and counted.
func ReadReceipts(r io.Reader, max int) ([]Receipt, int, error) {
	var out []Receipt
	_, skipped, err := readLines(r, MaxReceiptBytes, max, func(line []byte) error {
		rc, err := DecodeReceipt(line)
		if err != nil {
			return err
		}
		out = append(out, rc)
		return nil
	})
	if err != nil {
		return out, skipped, fmt.Errorf("ledger: receipts: %w", err)
	}
	return out, skipped, nil
}

// ReadHistory reads JSON-lines term records from r (a history file, or
// the node's /v1/ledger/terms) into a history in memory.
func ReadHistory(r io.Reader, swarm string) (*History, error) {
	h, _ := NewHistory(swarm)
	_, skipped, err := readLines(r, maxTermRecordBytes, maxTermRecords, func(line []byte) error {
		t, err := DecodeTermRecord(line)
		if err != nil {
			return err
		}
		if err := h.add(t); err != nil && !errors.Is(err, ErrTermConflict) {
			return err
		}
		return nil
	})
	h.skipped = skipped
	if err != nil {
		return nil, fmt.Errorf("ledger: history: %w", err)
	}
	return h, nil
}
