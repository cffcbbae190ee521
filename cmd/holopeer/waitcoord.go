package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/holopeer/holopeer/gossip"
	"github.com/holopeer/holopeer/peer/node"
)

// Defaults of the wait for a coordinator.
const (
	defaultCoordinatorWait = 2 * time.Minute
	// diagnoseAfter is how long a cause Diagnose names may take to clear
	// (members found, an election finished) before the wait gives up on
	// it: long enough for a healthy swarm to be found, short enough that
	// a wrong --swarm is said within seconds.
	diagnoseAfter = 8 * time.Second
	progressEvery = 5 * time.Second
)

// awaitCoordinator waits up to timeout (0: the default) for n to follow a
// coordinator, writing a progress line to progress (nil: none) every few
// seconds. Once a cause that stops any coordinator being followed (no
// member, no candidate, refused evidence) has held for diagnoseAfter, it
// returns that cause instead of waiting out the timeout.
func awaitCoordinator(ctx context.Context, n *node.Node, timeout time.Duration, progress io.Writer) (*gossip.CoordinatorInfo, error) {
	if timeout <= 0 {
		timeout = defaultCoordinatorWait
	}
	start := time.Now()
	deadline := start.Add(timeout)
	lastProgress := start
	var since time.Time // when the current diagnosis first held
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if c := n.Gossip().Coordinator(); c != nil {
			return c, nil
		}
		now := time.Now()
		why := n.Diagnose()
		switch {
		case why == nil:
			since = time.Time{}
		case since.IsZero():
			since = now
		case now.Sub(since) >= min(diagnoseAfter, timeout):
			return nil, fmt.Errorf("no coordinator after %v: %w", now.Sub(start).Round(time.Second), why)
		}
		if now.After(deadline) {
			return nil, fmt.Errorf("no coordinator elected within --timeout %v (%s); an election normally takes seconds: see the node's WARN lines", timeout, n.CoordinatorProgress())
		}
		if progress != nil && now.Sub(lastProgress) >= progressEvery {
			lastProgress = now
			fmt.Fprintf(progress, "waiting for a coordinator (%v): %s\n", now.Sub(start).Round(time.Second), n.CoordinatorProgress())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}
