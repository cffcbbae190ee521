package election

import (
	"fmt"
	"sync/atomic"
)

// Fence is the fencing check for everything a coordinator sends (plans,
// commands, receipts): each carries its term, and a Fence refuses any term
// older than the newest it has seen accepted. It is safe for concurrent
// use; the owner of the election Node calls Advance on every status change.
type Fence struct{ newest atomic.Uint64 }

// Advance raises the floor to term (it never lowers it).
func (f *Fence) Advance(term uint64) {
	for {
		cur := f.newest.Load()
		if term <= cur || f.newest.CompareAndSwap(cur, term) {
			return
		}
	}
}

// Newest is the newest accepted term.
func (f *Fence) Newest() uint64 { return f.newest.Load() }

// AcceptTerm returns nil when term is not older than the newest accepted
// term, and an error wrapping ErrStaleTerm otherwise.
func (f *Fence) AcceptTerm(term uint64) error {
	if n := f.newest.Load(); term < n {
		return fmt.Errorf("%w: term %d is older than accepted term %d", ErrStaleTerm, term, n)
	}
	return nil
}
