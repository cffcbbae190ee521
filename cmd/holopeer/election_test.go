package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// agreed returns the coordinator every live node follows, or an error
// saying who disagrees.
func agreed(nodes []*testNode) (*api.Coordinator, error) {
	var first *api.Coordinator
	for _, n := range nodes {
		st, err := statusOf(n.api)
		if err != nil {
			return nil, err
		}
		c := st.Coordinator
		if c == nil {
			return nil, fmt.Errorf("%s follows no coordinator", n.id)
		}
		if first == nil {
			first = c
		} else if c.PeerID != first.PeerID || c.Term != first.Term {
			return nil, fmt.Errorf("%s follows %s term %d, another node %s term %d", n.id, c.PeerID, c.Term, first.PeerID, first.Term)
		}
	}
	return first, nil
}

// TestElectionFiveProcesses: five `holopeer up` processes on a swarm that
// allows sim (four attest with sim, one with none) agree on one
// coordinator within 20 s; when its process is killed, the survivors agree
// on a new one in a higher term within 15 s; the node without a TEE never
// coordinates; every status marks the sim coordinator INSECURE.
func TestElectionFiveProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	first := upNode(t, "elect", "", "--tee", "sim", "--allow-sim")
	nodes := []*testNode{first}
	for i := 0; i < 3; i++ {
		nodes = append(nodes, upNode(t, "elect", first.addr, "--tee", "sim", "--allow-sim"))
	}
	none := upNode(t, "elect", first.addr, "--tee", "none", "--allow-sim")
	nodes = append(nodes, none)
	start := time.Now()
	var c *api.Coordinator
	eventually(t, 20*time.Second, "five nodes agree on a coordinator", func() error {
		var err error
		c, err = agreed(nodes)
		return err
	})
	t.Logf("agreed on %s term %d in %v", c.PeerID, c.Term, time.Since(start).Round(time.Millisecond))
	if c.PeerID == none.id {
		t.Fatal("the node without a TEE coordinates")
	}
	if !c.Insecure || c.TEE != "sim" {
		t.Fatalf("coordinator %+v: sim must be marked insecure", c)
	}
	var survivors []*testNode
	for _, n := range nodes {
		if n.id == c.PeerID {
			n.p.cmd.Process.Signal(syscall.SIGKILL)
			<-n.p.done
			continue
		}
		survivors = append(survivors, n)
	}
	killed := time.Now()
	var next *api.Coordinator
	eventually(t, 15*time.Second, "the survivors agree on a new coordinator", func() error {
		var err error
		next, err = agreed(survivors)
		if err == nil && (next.PeerID == c.PeerID || next.Term <= c.Term) {
			return fmt.Errorf("still %s term %d", next.PeerID, next.Term)
		}
		return err
	})
	t.Logf("after the kill: %s term %d in %v", next.PeerID, next.Term, time.Since(killed).Round(time.Millisecond))
	if next.PeerID == none.id {
		t.Fatal("the node without a TEE coordinates")
	}
}
