// Package coord is the coordinator's job logic: it plans where a job's
// stages run, signs the plan with the coordinator's identity and its term
// (the fencing token), and re-plans a stage when its node goes silent. The
// planner is a pure function of the job and the offers; it does no I/O, so
// its choices can be tested exhaustively and replayed.
//
// The coordinator is never in the data path: a plan names peers, and the
// stages stream activations to each other directly.
package coord

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/holopeer/holopeer/stage/job"
)

// Offer is one machine on offer, as its signed capability record and the
// swarm's measurements describe it.
type Offer struct {
	PeerID      string
	GFLOPS      float64
	MemoryBytes uint64
	Relayed     bool
	Backend     string
	// RTT to other peers by peer id, as measured by the offering node;
	// missing entries are unknown.
	RTT map[string]time.Duration
}

// PlaceRequest is what the planner needs of a job.
type PlaceRequest struct {
	JobID      string
	Researcher string // peer id of the researcher's node: first and last stage
	Stages     int
	Replicas   int
	Layers     int
	// LayerBytes is the memory one block needs on a stage (weights,
	// gradients, optimizer state); StageBytes is what a stage needs on top
	// of its blocks (activations in flight, buffers).
	LayerBytes    uint64
	StageBytes    uint64
	RefuseRelayed bool
	Exclude       []string // peers never to place (e.g. one that just failed)
}

// StagePlan is one stage of a plan (see package job).
type StagePlan = job.StagePlan

// ErrInsufficient is returned when the swarm does not lend enough.
var ErrInsufficient = errors.New("the swarm does not offer enough")

// Place chooses Stages×Replicas nodes, splits the layers among the stages
// in proportion to their throughput without exceeding any node's memory,
// and orders the stages so that neighbours have low latency. The result is
// deterministic for the same inputs.
func Place(req PlaceRequest, offers []Offer) ([]StagePlan, []string, error) {
	if req.Stages <= 0 || req.Replicas <= 0 || req.Layers < req.Stages {
		return nil, nil, fmt.Errorf("plan: %d layers cannot fill %d stages × %d replicas", req.Layers, req.Stages, req.Replicas)
	}
	need := req.Stages * req.Replicas
	minMem := req.StageBytes + req.LayerBytes
	var eligible []Offer
	var refused []string
	for _, o := range offers {
		switch {
		case o.PeerID == req.Researcher || slices.Contains(req.Exclude, o.PeerID):
		case req.RefuseRelayed && o.Relayed:
			refused = append(refused, o.PeerID+" (relayed)")
		case o.MemoryBytes < minMem:
			refused = append(refused, fmt.Sprintf("%s (lends %s, a stage needs at least %s)", short(o.PeerID), humanize.IBytes(o.MemoryBytes), humanize.IBytes(minMem)))
		default:
			eligible = append(eligible, o)
		}
	}
	if len(eligible) < need {
		return nil, nil, fmt.Errorf("%w: the job needs %d nodes (%d stages × %d replicas) with at least %s each, and %d are on offer%s",
			ErrInsufficient, need, req.Stages, req.Replicas, humanize.IBytes(minMem), len(eligible), refusedNote(refused))
	}
	// Fastest first; ties by peer id so every coordinator picks alike.
	slices.SortFunc(eligible, func(a, b Offer) int {
		if c := cmp.Compare(b.GFLOPS, a.GFLOPS); c != 0 {
			return c
		}
		return cmp.Compare(a.PeerID, b.PeerID)
	})
	chosen, spares := eligible[:need], eligible[need:]

	// Replicas of a stage share its microbatches round-robin, so a stage
	// runs at Replicas × its slowest replica; grouping similar speeds
	// together wastes the least.
	groups := make([][]Offer, req.Stages)
	for s := range groups {
		groups[s] = chosen[s*req.Replicas : (s+1)*req.Replicas]
	}
	groups = orderByLatency(req.Researcher, groups)

	speed := make([]float64, req.Stages)
	capLayers := make([]int, req.Stages)
	for s, g := range groups {
		minSpeed, minMemory := math.Inf(1), uint64(math.MaxUint64)
		for _, o := range g {
			minSpeed = min(minSpeed, max(o.GFLOPS, 0.1))
			minMemory = min(minMemory, o.MemoryBytes)
		}
		speed[s] = minSpeed * float64(len(g))
		if req.LayerBytes == 0 {
			capLayers[s] = req.Layers
		} else {
			capLayers[s] = int((minMemory - req.StageBytes) / req.LayerBytes)
		}
	}
	layers, err := splitLayers(req.Layers, speed, capLayers)
	if err != nil {
		return nil, nil, err
	}
	plans := make([]StagePlan, req.Stages)
	first := 0
	for s, g := range groups {
		ids := make([]string, len(g))
		for i, o := range g {
			ids[i] = o.PeerID
		}
		plans[s] = StagePlan{Index: s, First: first, Last: first + layers[s], Replicas: ids}
		first += layers[s]
	}
	spareIDs := make([]string, len(spares))
	for i, o := range spares {
		spareIDs[i] = o.PeerID
	}
	return plans, spareIDs, nil
}

// splitLayers gives each stage at least one layer and at most its cap, in
// proportion to speed (largest remainder), then moves layers off stages
// over their cap onto the fastest stages with room.
func splitLayers(total int, speed []float64, caps []int) ([]int, error) {
	n := len(speed)
	sumCap := 0
	for s := range caps {
		if caps[s] < 1 {
			return nil, fmt.Errorf("%w: stage %d's nodes cannot hold even one block", ErrInsufficient, s)
		}
		sumCap += caps[s]
	}
	if sumCap < total {
		return nil, fmt.Errorf("%w: the chosen nodes can hold %d of the model's %d blocks", ErrInsufficient, sumCap, total)
	}
	var sum float64
	for _, v := range speed {
		sum += v
	}
	out := make([]int, n)
	rem := make([]float64, n)
	given := 0
	for s := range out {
		share := float64(total-n) * speed[s] / sum // one layer each is given up front
		out[s] = 1 + int(share)
		rem[s] = share - math.Floor(share)
		given += out[s]
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
	for i := 0; given < total; i++ {
		out[order[i%n]]++
		given++
	}
	// Respect memory caps.
	byspeed := make([]int, n)
	copy(byspeed, order)
	slices.SortStableFunc(byspeed, func(a, b int) int { return cmp.Compare(speed[b], speed[a]) })
	for s := range out {
		for out[s] > caps[s] {
			moved := false
			for _, t := range byspeed {
				if out[t] < caps[t] {
					out[t]++
					out[s]--
					moved = true
					break
				}
			}
			if !moved {
				return nil, fmt.Errorf("%w: no room to place %d blocks", ErrInsufficient, total)
			}
		}
	}
	return out, nil
}

// orderByLatency orders stage groups as a chain starting and ending at the
// researcher, picking each next stage nearest to the previous one (greedy
// nearest neighbour on measured RTTs; unknown RTTs count as far). With no
// measurements the order is by peer id.
func orderByLatency(researcher string, groups [][]Offer) [][]Offer {
	rtt := func(from string, g []Offer) time.Duration {
		const unknown = time.Hour
		best := unknown
		for _, o := range g {
			if d, ok := o.RTT[from]; ok && d < best {
				best = d
			}
		}
		return best
	}
	left := slices.Clone(groups)
	slices.SortFunc(left, func(a, b []Offer) int { return cmp.Compare(a[0].PeerID, b[0].PeerID) })
	out := make([][]Offer, 0, len(groups))
	prev := researcher
	for len(left) > 0 {
		bi := 0
		for i := 1; i < len(left); i++ {
			if rtt(prev, left[i]) < rtt(prev, left[bi]) {
				bi = i
			}
		}
		out = append(out, left[bi])
		prev = left[bi][0].PeerID
		left = slices.Delete(left, bi, bi+1)
	}
	return out
}

// Replace re-plans after node dead leaves: if its stage has other
// replicas, it simply drops out; otherwise the fastest spare that can hold
// the stage's blocks takes its place. It returns the new stages and the
// spares left.
func Replace(stages []StagePlan, spares []string, dead string, offers []Offer, req PlaceRequest) ([]StagePlan, []string, error) {
	out := make([]StagePlan, len(stages))
	for i, s := range stages {
		out[i] = s
		out[i].Replicas = slices.Clone(s.Replicas)
	}
	spares = slices.DeleteFunc(slices.Clone(spares), func(p string) bool { return p == dead })
	for i := range out {
		j := slices.Index(out[i].Replicas, dead)
		if j < 0 {
			continue
		}
		out[i].Replicas = slices.Delete(out[i].Replicas, j, j+1)
		if len(out[i].Replicas) > 0 {
			return out, spares, nil
		}
		need := req.StageBytes + uint64(out[i].Last-out[i].First)*req.LayerBytes
		byID := map[string]Offer{}
		for _, o := range offers {
			byID[o.PeerID] = o
		}
		// A plan never names a peer twice: a "spare" that already holds a
		// stage (a stale spare list, as a coordinator that took the job
		// over rebuilds it) is no candidate.
		placed := map[string]bool{}
		for _, s := range out {
			for _, r := range s.Replicas {
				placed[r] = true
			}
		}
		best := ""
		for _, p := range spares {
			o, ok := byID[p]
			if !ok || placed[p] || o.MemoryBytes < need || (req.RefuseRelayed && o.Relayed) {
				continue
			}
			if best == "" || o.GFLOPS > byID[best].GFLOPS || (o.GFLOPS == byID[best].GFLOPS && p < best) {
				best = p
			}
		}
		if best == "" {
			return nil, nil, fmt.Errorf("%w: no spare node can take stage %d (blocks %d-%d, %s) after %s left", ErrInsufficient, i, out[i].First, out[i].Last-1, humanize.IBytes(need), short(dead))
		}
		out[i].Replicas = []string{best}
		spares = slices.DeleteFunc(spares, func(p string) bool { return p == best })
		return out, spares, nil
	}
	return nil, nil, fmt.Errorf("plan: %s holds no stage", short(dead))
}

func refusedNote(refused []string) string {
	if len(refused) == 0 {
		return ""
	}
	return fmt.Sprintf("; refused: %v", refused)
}

func short(id string) string {
	if len(id) > 16 {
		return id[:6] + "…" + id[len(id)-6:]
	}
	return id
}
