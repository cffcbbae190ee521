package gossip

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// rejectLog logs rejections at most once per key per interval, counting
// the rest, so a flood of bad messages cannot flood the log. It is safe
// for concurrent use (validators run in parallel).
type rejectLog struct {
	log      *slog.Logger
	clock    Clock
	interval time.Duration

	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
	counts  map[string]uint64 // by reason, for Stats
}

const rejectLogKeys = 4096

func newRejectLog(l *slog.Logger, c Clock, interval time.Duration) *rejectLog {
	return &rejectLog{log: l, clock: c, interval: interval,
		last: map[string]time.Time{}, dropped: map[string]int{}, counts: map[string]uint64{}}
}

// note records a rejection of a message from author for reason and logs
// it unless the same (topic, reason, author) was logged recently.
func (r *rejectLog) note(level slog.Level, topic, reason, author string, err error) {
	now := r.clock.Now()
	key := topic + "\x00" + reason + "\x00" + author
	r.mu.Lock()
	r.counts[reason]++
	last, seen := r.last[key]
	if seen && now.Sub(last) < r.interval {
		r.dropped[key]++
		r.mu.Unlock()
		return
	}
	if len(r.last) >= rejectLogKeys {
		clear(r.last) // forget rather than grow without bound
		clear(r.dropped)
	}
	suppressed := r.dropped[key]
	delete(r.dropped, key)
	r.last[key] = now
	r.mu.Unlock()
	attrs := []any{"topic", topic, "reason", reason, "from", author, "err", err}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	r.log.Log(context.Background(), level, "gossip: message rejected", attrs...)
}

func (r *rejectLog) snapshot() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.counts))
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}
