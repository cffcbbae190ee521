package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// Errors Store.Add returns for a receipt it has no room for.
var (
	ErrStoreFull  = errors.New("receipt store is full")
	ErrSignerFull = errors.New("the signer's share of the receipt store is full")
)

// DefaultMaxReceipts bounds a store: about 100 MB of file at ~500 bytes a
// receipt, a year of 5-minute receipts for twenty nodes.
const DefaultMaxReceipts = 200_000

// DefaultSignerShare is the fraction of a store one signer may fill
// (1/DefaultSignerShare of its maximum), so that no single key, even a
// coordinator gone bad, can crowd out every other coordinator's receipts.
const DefaultSignerShare = 4

// maxTermAhead is how far past the newest recorded term a receipt's term
// may be to be held until its term is recorded: a receipt can arrive just
// before the claim of its term, but not a thousand terms early.
const maxTermAhead = 2

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithMaxReceipts bounds the number of receipts kept.
func WithMaxReceipts(n int) StoreOption { return func(s *Store) { s.max = n } }

// WithMaxPerSigner bounds the receipts kept of any one signer (default
// the maximum / DefaultSignerShare).
func WithMaxPerSigner(n int) StoreOption { return func(s *Store) { s.maxSigner = n } }

// WithRefusals calls f with the reason (see Reason) of every receipt Add
// refuses, for the node's refusal metric. f must not block.
func WithRefusals(f func(reason string)) StoreOption { return func(s *Store) { s.refusals = f } }

// WithLogger logs skipped lines and refused receipts.
func WithLogger(l *slog.Logger) StoreOption { return func(s *Store) { s.log = l } }

// WithTermCheck makes Add refuse receipts whose term the history does not
// know, or knows to have had another coordinator. Without it anyone with a
// key could fill the store with receipts of made-up terms that Verify
// would never count. (Ledger.Add holds receipts of the next few terms in
// memory until the election records them.)
func WithTermCheck(h *History) StoreOption { return func(s *Store) { s.hist = h } }

// Store keeps the receipts a node has heard, deduplicated by hash, in an
// append-only JSON-lines file (or in memory when opened with path "").
type Store struct {
	// Set at construction.
	swarm     string
	max       int
	maxSigner int
	log       *slog.Logger
	hist      *History
	refusals  func(reason string)

	mu       sync.Mutex // guards all following fields
	f        *os.File
	seen     map[Hash]struct{}
	receipts []Receipt
	bySigner map[string]int // receipts kept per coordinator
	version  uint64
	skipped  int
}

// OpenStore loads the store file at path (creating it if absent) and
// appends receipts added later. Only receipts of swarm are kept. Lines
// that do not parse are skipped and counted (Skipped).
func OpenStore(path, swarm string, opts ...StoreOption) (*Store, error) {
	s := &Store{swarm: swarm, max: DefaultMaxReceipts, log: slog.Default(), seen: map[Hash]struct{}{}, bySigner: map[string]int{}}
	for _, o := range opts {
		o(s)
	}
	if s.max <= 0 {
		return nil, fmt.Errorf("ledger: store: max receipts %d", s.max)
	}
	if s.maxSigner == 0 {
		s.maxSigner = max(s.max/DefaultSignerShare, 1)
	}
	if s.maxSigner < 0 {
		return nil, fmt.Errorf("ledger: store: max receipts per signer %d", s.maxSigner)
	}
	if path == "" {
		return s, nil
	}
	rs, skipped, err := LoadReceipts(path, s.max)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, r := range rs {
		if r.Swarm != swarm {
			skipped++
			continue
		}
		h := r.Hash()
		if _, dup := s.seen[h]; dup {
			continue
		}
		s.seen[h] = struct{}{}
		s.receipts = append(s.receipts, r)
		s.bySigner[r.Coordinator]++
	}
	s.skipped = skipped
	if skipped > 0 {
		s.log.Warn("ledger: skipped unreadable receipt lines", "file", path, "lines", skipped)
	}
	if s.f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("ledger: store: %w", err)
	}
	return s, nil
}

// LoadReceipts reads a store file without opening it for writing, as
// `holopeer ledger verify` does. Lines that are not receipts are skipped
// and counted; signatures are not checked here (Verify does).
func LoadReceipts(path string, max int) ([]Receipt, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: receipts: %w", err)
	}
	defer f.Close()
	return ReadReceipts(f, max)
}

// Add checks a receipt's fields, swarm and signature (and, with
// WithTermCheck, its term) and keeps it unless it is already kept. It
// reports whether the receipt was new.
func (s *Store) Add(r Receipt) (bool, error) {
	added, err := s.add(r)
	if err != nil && s.refusals != nil {
		s.refusals(Reason(err))
	}
	return added, err
}

func (s *Store) add(r Receipt) (bool, error) {
	if err := r.Validate(); err != nil {
		return false, err
	}
	if r.Swarm != s.swarm {
		return false, fmt.Errorf("%w: %q, this node is in %q", ErrOtherSwarm, r.Swarm, s.swarm)
	}
	h := r.Hash()
	s.mu.Lock()
	_, dup := s.seen[h]
	s.mu.Unlock()
	if dup {
		return false, nil
	}
	if err := r.CheckSignature(); err != nil {
		return false, err
	}
	if s.hist != nil {
		c, ok := s.hist.CoordinatorOf(r.Term)
		if !ok {
			return false, fmt.Errorf("%w: term %d (newest known %d)", ErrUnknownTerm, r.Term, s.hist.Newest())
		}
		if c != r.Coordinator {
			return false, fmt.Errorf("%w: term %d was %s's, signed by %s", ErrNotCoordinator, r.Term, c, r.Coordinator)
		}
	}
	line, err := encodeLine(r)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.seen[h]; dup {
		return false, nil
	}
	if len(s.receipts) >= s.max {
		return false, fmt.Errorf("%w (%d receipts)", ErrStoreFull, s.max)
	}
	if s.bySigner[r.Coordinator] >= s.maxSigner {
		return false, fmt.Errorf("%w: %s already has %d receipts here", ErrSignerFull, r.Coordinator, s.maxSigner)
	}
	if s.f != nil {
		if _, err := s.f.Write(line); err != nil {
			return false, fmt.Errorf("ledger: store: %w", err)
		}
	}
	s.seen[h] = struct{}{}
	s.receipts = append(s.receipts, r)
	s.bySigner[r.Coordinator]++
	s.version++
	return true, nil
}

// SignerLen is the number of receipts kept that signer signed.
func (s *Store) SignerLen(signer string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bySigner[signer]
}

// AddEncoded decodes a receipt from untrusted bytes (a gossip message) and
// adds it.
func (s *Store) AddEncoded(b []byte) (bool, error) {
	r, err := DecodeReceipt(b)
	if err != nil {
		return false, err
	}
	return s.Add(r)
}

// Receipts is a copy of the receipts kept, in the order they were added.
func (s *Store) Receipts() []Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Receipt(nil), s.receipts...)
}

// Len is the number of receipts kept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.receipts)
}

// Skipped counts lines of the file that were not receipts of this swarm.
func (s *Store) Skipped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped
}

func (s *Store) changes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Close closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

func encodeLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("ledger: encode: %w", err)
	}
	return append(b, '\n'), nil
}
