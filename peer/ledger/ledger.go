package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/holopeer/holopeer/peer/api"
)

// Where a node keeps its ledger: <data dir>/ledger/{receipts,terms}.jsonl.
const (
	DirName      = "ledger"
	ReceiptsFile = "receipts.jsonl"
	TermsFile    = "terms.jsonl"
)

// Dir is the ledger directory inside a node's data dir.
func Dir(dataDir string) string { return filepath.Join(dataDir, DirName) }

// Bounds on the receipts a Ledger holds in memory for a term its election
// has not recorded yet.
const (
	maxPending          = 1024
	maxPendingPerSigner = 128
)

// ErrTermPending is returned by Ledger.Add for a receipt of a term just
// beyond the newest recorded: it is held in memory, not stored, and kept
// only if the election then records that term with its signer.
var ErrTermPending = errors.New("receipt held until its term is recorded")

// ErrPendingFull is returned by Ledger.Add when the signer's (or every
// signer's) share of the held receipts is used up.
var ErrPendingFull = errors.New("too many receipts held for terms not yet recorded")

// Ledger is a node's ledger: the receipts it keeps, the terms its election
// accepted, and the totals it verified from them (cached until either
// changes).
type Ledger struct {
	swarm    string
	store    *Store
	hist     *History
	ver      *Verifier
	refusals func(reason string)

	pmu     sync.Mutex // guards pending
	pending map[uint64][]Receipt

	mu       sync.Mutex // guards the cache; held while verifying
	cacheKey [2]uint64
	cache    *Report
}

// Open opens (creating if needed) the ledger in a node's data dir.
func Open(dataDir, swarm string, opts ...StoreOption) (*Ledger, error) {
	dir := Dir(dataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	// A ledger made by an older version was 0755: close it up.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	hist, err := OpenHistory(filepath.Join(dir, TermsFile), swarm)
	if err != nil {
		return nil, err
	}
	store, err := OpenStore(filepath.Join(dir, ReceiptsFile), swarm, append([]StoreOption{WithTermCheck(hist)}, opts...)...)
	if err != nil {
		hist.Close()
		return nil, err
	}
	return newLedger(swarm, store, hist), nil
}

func newLedger(swarm string, store *Store, hist *History) *Ledger {
	return &Ledger{swarm: swarm, store: store, hist: hist, ver: NewVerifier(), refusals: store.refusals, pending: map[uint64][]Receipt{}}
}

// Store is the receipts kept.
func (l *Ledger) Store() *Store { return l.store }

// History is the terms recorded.
func (l *Ledger) History() *History { return l.hist }

// Swarm is the swarm the ledger belongs to.
func (l *Ledger) Swarm() string { return l.swarm }

// Add keeps a receipt (from gossip, or one this node issued as
// coordinator). A receipt of a term the history does not know is refused,
// except one of the next maxTermAhead terms, which may arrive just before
// the election records its term: that one is held in memory (bounded per
// signer) and Add returns ErrTermPending.
func (l *Ledger) Add(r Receipt) (bool, error) {
	added, err := l.store.add(r)
	if errors.Is(err, ErrUnknownTerm) {
		if n := l.hist.Newest(); r.Term > n && r.Term <= n+maxTermAhead {
			err = l.hold(r)
		}
	}
	if err != nil && !errors.Is(err, ErrTermPending) && l.refusals != nil {
		l.refusals(Reason(err))
	}
	return added, err
}

// hold keeps r (already checked but for its term) until its term is
// recorded.
func (l *Ledger) hold(r Receipt) error {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	total, mine := 0, 0
	h := r.Hash()
	for _, rs := range l.pending {
		for _, p := range rs {
			total++
			if p.Coordinator == r.Coordinator {
				mine++
			}
			if p.Hash() == h {
				return ErrTermPending
			}
		}
	}
	if total >= maxPending || mine >= maxPendingPerSigner {
		return fmt.Errorf("%w: %s holds %d, all signers %d", ErrPendingFull, r.Coordinator, mine, total)
	}
	l.pending[r.Term] = append(l.pending[r.Term], r)
	return ErrTermPending
}

// RecordTerm records a term the election accepted. Call it whenever the
// followed coordinator or term changes. Receipts held for that term are
// then kept if its coordinator signed them; receipts held for terms now
// too old to be recorded are dropped.
func (l *Ledger) RecordTerm(t TermRecord) error {
	if t.Swarm == "" {
		t.Swarm = l.swarm
	}
	if err := l.hist.Record(t); err != nil {
		return err
	}
	l.pmu.Lock()
	held := l.pending[t.Term]
	delete(l.pending, t.Term)
	for term := range l.pending {
		if term < t.Term {
			delete(l.pending, term)
		}
	}
	l.pmu.Unlock()
	for _, r := range held {
		// Add checks the signer against the term just recorded.
		_, _ = l.store.Add(r)
	}
	return nil
}

// Pending is the number of receipts held for terms not yet recorded.
func (l *Ledger) Pending() int {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	n := 0
	for _, rs := range l.pending {
		n += len(rs)
	}
	return n
}

// Report verifies the receipts kept against the terms recorded. It is
// recomputed only when a receipt or a term was added since the last call.
func (l *Ledger) Report() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := [2]uint64{l.store.changes(), l.hist.changes()}
	if l.cache != nil && key == l.cacheKey {
		return *l.cache
	}
	rep := l.ver.Verify(l.swarm, l.store.Receipts(), l.hist)
	l.cache, l.cacheKey = &rep, key
	return rep
}

// Leaderboard is every credited peer's verified total, most points first:
// what the dashboard shows.
func (l *Ledger) Leaderboard() []api.LedgerEntry { return l.Report().Totals }

// Close closes both files.
func (l *Ledger) Close() error {
	err1 := l.store.Close()
	err2 := l.hist.Close()
	if err1 != nil {
		return err1
	}
	return err2
}
