package ledger

import (
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

// Ledger is a node's ledger: the receipts it keeps, the terms its election
// accepted, and the totals it verified from them (cached until either
// changes).
type Ledger struct {
	swarm string
	store *Store
	hist  *History
	ver   *Verifier

	mu       sync.Mutex // guards the cache; held while verifying
	cacheKey [2]uint64
	cache    *Report
}

// Open opens (creating if needed) the ledger in a node's data dir.
func Open(dataDir, swarm string, opts ...StoreOption) (*Ledger, error) {
	dir := Dir(dataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
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
	return &Ledger{swarm: swarm, store: store, hist: hist, ver: NewVerifier()}, nil
}

// Store is the receipts kept.
func (l *Ledger) Store() *Store { return l.store }

// History is the terms recorded.
func (l *Ledger) History() *History { return l.hist }

// Swarm is the swarm the ledger belongs to.
func (l *Ledger) Swarm() string { return l.swarm }

// Add keeps a receipt (from gossip, or one this node issued as
// coordinator).
func (l *Ledger) Add(r Receipt) (bool, error) { return l.store.Add(r) }

// RecordTerm records a term the election accepted. Call it whenever the
// followed coordinator or term changes.
func (l *Ledger) RecordTerm(t TermRecord) error {
	if t.Swarm == "" {
		t.Swarm = l.swarm
	}
	return l.hist.Record(t)
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
