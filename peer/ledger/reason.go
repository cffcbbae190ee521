package ledger

import "errors"

// Reason is a short fixed word for why a receipt was refused, for the
// refusal metric's reason label (never an error text, whose values would
// be unbounded).
func Reason(err error) string {
	for _, c := range []struct {
		err    error
		reason string
	}{
		{ErrBadSignature, "bad_signature"},
		{ErrOtherSwarm, "other_swarm"},
		{ErrUnknownTerm, "unknown_term"},
		{ErrNotCoordinator, "not_coordinator"},
		{ErrSignerFull, "signer_full"},
		{ErrStoreFull, "store_full"},
		{ErrPendingFull, "pending_full"},
		{ErrDuplicate, "duplicate"},
		{ErrOverlap, "overlap"},
		{ErrMalformed, "malformed"},
	} {
		if errors.Is(err, c.err) {
			return c.reason
		}
	}
	if err == nil {
		return "none"
	}
	return "other"
}
