package ledger

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// TermHistory answers who was coordinator in a term. The election keeps
// the authoritative answer; History is its record on disk.
type TermHistory interface {
	CoordinatorOf(term uint64) (peerID string, ok bool)
}

// ErrTermConflict is returned by History.Record for a second, different
// coordinator of a term already recorded. The election never accepts two
// (that is its safety property), so a conflict means a corrupt or doctored
// file; the term then answers no one.
var ErrTermConflict = errors.New("term already has another coordinator")

// Limits on a history file.
const (
	maxTermRecordBytes = 1024
	maxTermRecords     = 1 << 20
	maxTEELen          = 32
)

// TermRecord is one term as this node's election accepted it.
type TermRecord struct {
	Swarm       string    `json:"swarm"`
	Term        uint64    `json:"term"`
	Coordinator string    `json:"coordinator"`
	TEE         string    `json:"tee,omitempty"`      // the coordinator's attestation kind: sev-snp, tdx, sim
	Insecure    bool      `json:"insecure,omitempty"` // sim attestation: testnets only
	AcceptedAt  time.Time `json:"accepted_at"`
}

func (t TermRecord) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: term record: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	if t.Swarm == "" || len(t.Swarm) > maxSwarmLen || !printable(t.Swarm) {
		return bad("swarm %q", clip(t.Swarm))
	}
	if t.Term == 0 {
		return bad("term 0")
	}
	if len(t.Coordinator) == 0 || len(t.Coordinator) > maxIDLen {
		return bad("coordinator id of %d bytes", len(t.Coordinator))
	}
	if _, err := peer.Decode(t.Coordinator); err != nil {
		return bad("coordinator %q is not a peer id", clip(t.Coordinator))
	}
	if len(t.TEE) > maxTEELen || !printable(t.TEE) {
		return bad("tee %q", clip(t.TEE))
	}
	return nil
}

// DecodeTermRecord parses one line of a history file from untrusted bytes.
func DecodeTermRecord(b []byte) (TermRecord, error) {
	var t TermRecord
	if err := decodeStrict(b, maxTermRecordBytes, &t); err != nil {
		return TermRecord{}, fmt.Errorf("%w: term record: %v", ErrMalformed, err)
	}
	return t, t.validate()
}

// History is the terms a node accepted, kept in memory and, when opened
// from a file, appended to it (JSON lines, one TermRecord each).
type History struct {
	mu        sync.Mutex
	swarm     string
	terms     map[uint64]TermRecord
	conflicts map[uint64]bool
	newest    uint64
	version   uint64
	f         *os.File // nil for a history in memory
	skipped   int
}

// NewHistory is an empty history in memory for swarm ("" adopts the swarm
// of the first record).
func NewHistory(swarm string, records ...TermRecord) (*History, error) {
	h := &History{swarm: swarm, terms: map[uint64]TermRecord{}, conflicts: map[uint64]bool{}}
	for _, r := range records {
		if err := h.add(r); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// OpenHistory loads the history file at path, creating it if absent, and
// appends later records to it. Lines that do not parse, or name another
// swarm, are skipped and counted (Skipped).
func OpenHistory(path, swarm string) (*History, error) {
	h, err := LoadHistory(path, swarm)
	if errors.Is(err, os.ErrNotExist) {
		h, _ = NewHistory(swarm)
	} else if err != nil {
		return nil, err
	}
	if h.f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("ledger: history: %w", err)
	}
	return h, nil
}

// LoadHistory reads a history file without opening it for writing, as
// `holopeer ledger verify` does on a data dir a node may be using.
func LoadHistory(path, swarm string) (*History, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ledger: history: %w", err)
	}
	defer f.Close()
	h, err := ReadHistory(f, swarm)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// add records t in memory: idempotent for the same coordinator, a
// conflict (kept, and the term disowned) for another.
func (h *History) add(t TermRecord) error {
	if err := t.validate(); err != nil {
		return err
	}
	if h.swarm == "" {
		h.swarm = t.Swarm
	}
	if t.Swarm != h.swarm {
		return fmt.Errorf("%w: term %d is of swarm %q, this history is %q", ErrOtherSwarm, t.Term, t.Swarm, h.swarm)
	}
	if old, ok := h.terms[t.Term]; ok {
		if old.Coordinator == t.Coordinator {
			return nil
		}
		h.conflicts[t.Term] = true
		h.version++
		return fmt.Errorf("%w: term %d: %s, then %s", ErrTermConflict, t.Term, old.Coordinator, t.Coordinator)
	}
	h.terms[t.Term] = t
	h.newest = max(h.newest, t.Term)
	h.version++
	return nil
}

// Record adds a term the election accepted, and appends it to the file.
// Recording the same term and coordinator again does nothing.
func (h *History) Record(t TermRecord) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.terms[t.Term]; ok && old.Coordinator == t.Coordinator && !h.conflicts[t.Term] {
		return nil
	}
	err := h.add(t)
	if err != nil && !errors.Is(err, ErrTermConflict) {
		return err
	}
	if h.f != nil {
		line, merr := encodeLine(t)
		if merr != nil {
			return merr
		}
		if _, werr := h.f.Write(line); werr != nil {
			return fmt.Errorf("ledger: history: %w", werr)
		}
	}
	return err
}

// CoordinatorOf implements TermHistory. A term with conflicting records
// has no coordinator.
func (h *History) CoordinatorOf(term uint64) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.terms[term]
	if !ok || h.conflicts[term] {
		return "", false
	}
	return t.Coordinator, true
}

// Term returns the record of one term.
func (h *History) Term(term uint64) (TermRecord, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.terms[term]
	return t, ok && !h.conflicts[term]
}

// Records lists the terms, oldest first (conflicting terms included once).
func (h *History) Records() []TermRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]TermRecord, 0, len(h.terms))
	for _, t := range h.terms {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b TermRecord) int { return cmpUint(a.Term, b.Term) })
	return out
}

// Newest is the highest term recorded (0 for none).
func (h *History) Newest() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.newest
}

// Swarm is the swarm the history belongs to.
func (h *History) Swarm() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.swarm
}

// Skipped counts the lines of the file that were not records.
func (h *History) Skipped() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.skipped
}

func (h *History) changes() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.version
}

// Close closes the file (a history in memory has none).
func (h *History) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.f == nil {
		return nil
	}
	err := h.f.Close()
	h.f = nil
	return err
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
