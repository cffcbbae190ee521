package coord

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func offers(gflops ...float64) []Offer {
	var out []Offer
	for i, g := range gflops {
		out = append(out, Offer{PeerID: fmt.Sprintf("p%02d", i), GFLOPS: g, MemoryBytes: 1 << 30})
	}
	return out
}

func TestPlaceProportional(t *testing.T) {
	req := PlaceRequest{Researcher: "r", Stages: 3, Replicas: 1, Layers: 12, LayerBytes: 1 << 20}
	st, spares, err := Place(req, offers(10, 20, 30, 5))
	if err != nil {
		t.Fatal(err)
	}
	if len(spares) != 1 || spares[0] != "p03" {
		t.Fatalf("spares %v: the slowest node should be the spare", spares)
	}
	got := map[string]int{}
	total := 0
	for i, s := range st {
		if s.Index != i || s.First != total {
			t.Fatalf("stage %d not contiguous: %+v", i, s)
		}
		got[s.Replicas[0]] = s.Last - s.First
		total = s.Last
	}
	if total != 12 {
		t.Fatalf("placed %d of 12 layers", total)
	}
	// 10:20:30 of 12 layers, one each up front: 1+1.5, 1+3, 1+4.5 → 2/3, 4, 5/6.
	if got["p02"] < got["p01"] || got["p01"] < got["p00"] || got["p02"] < 5 {
		t.Fatalf("layers not proportional to speed: %v", got)
	}
}

func TestPlaceMemoryCap(t *testing.T) {
	o := offers(100, 1, 1)
	o[0].MemoryBytes = 3 << 20 // fastest node holds only 3 layers
	req := PlaceRequest{Researcher: "r", Stages: 3, Replicas: 1, Layers: 12, LayerBytes: 1 << 20}
	st, _, err := Place(req, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Replicas[0] == "p00" && s.Last-s.First > 3 {
			t.Fatalf("node given %d layers, lends room for 3", s.Last-s.First)
		}
	}
}

func TestPlaceInsufficient(t *testing.T) {
	req := PlaceRequest{Researcher: "r", Stages: 3, Replicas: 2, Layers: 12, LayerBytes: 1 << 20}
	_, _, err := Place(req, offers(1, 1, 1, 1, 1))
	if !errors.Is(err, ErrInsufficient) || !strings.Contains(err.Error(), "needs 6 nodes") {
		t.Fatalf("got %v", err)
	}
	req = PlaceRequest{Researcher: "r", Stages: 2, Replicas: 1, Layers: 8, LayerBytes: 1 << 30, StageBytes: 1}
	_, _, err = Place(req, offers(1, 1, 1))
	if !errors.Is(err, ErrInsufficient) || !strings.Contains(err.Error(), "lends") {
		t.Fatalf("got %v", err)
	}
	o := offers(1, 1, 1)
	for i := range o {
		o[i].MemoryBytes = 3 << 20
	}
	req = PlaceRequest{Researcher: "r", Stages: 2, Replicas: 1, Layers: 12, LayerBytes: 1 << 20}
	_, _, err = Place(req, o)
	if !errors.Is(err, ErrInsufficient) || !strings.Contains(err.Error(), "hold 6 of the model's 12") {
		t.Fatalf("got %v", err)
	}
}

func TestPlaceRefusesRelayedAndResearcher(t *testing.T) {
	o := offers(50, 40, 30, 20)
	o[0].Relayed = true
	o[1].PeerID = "r"
	req := PlaceRequest{Researcher: "r", Stages: 2, Replicas: 1, Layers: 4, RefuseRelayed: true}
	st, _, err := Place(req, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Replicas[0] == "p00" || s.Replicas[0] == "r" {
			t.Fatalf("placed %s", s.Replicas[0])
		}
	}
}

func TestPlaceLatencyOrder(t *testing.T) {
	o := offers(10, 10, 10)
	ms := time.Millisecond
	o[0].RTT = map[string]time.Duration{"r": 90 * ms, "p01": 5 * ms, "p02": 80 * ms}
	o[1].RTT = map[string]time.Duration{"r": 80 * ms, "p00": 5 * ms, "p02": 5 * ms}
	o[2].RTT = map[string]time.Duration{"r": 5 * ms, "p00": 80 * ms, "p01": 5 * ms}
	st, _, err := Place(PlaceRequest{Researcher: "r", Stages: 3, Replicas: 1, Layers: 3}, o)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{st[0].Replicas[0], st[1].Replicas[0], st[2].Replicas[0]}
	if fmt.Sprint(got) != "[p02 p01 p00]" {
		t.Fatalf("order %v, want the low-latency chain r→p02→p01→p00", got)
	}
}

func TestPlaceDeterministicAndComplete(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := 0; trial < 200; trial++ {
		n := 3 + r.IntN(10)
		o := make([]Offer, n)
		for i := range o {
			o[i] = Offer{PeerID: fmt.Sprintf("p%02d", i), GFLOPS: float64(1 + r.IntN(100)), MemoryBytes: uint64(1+r.IntN(20)) << 20}
		}
		req := PlaceRequest{Researcher: "r", Stages: 1 + r.IntN(3), Replicas: 1 + r.IntN(2), Layers: 4 + r.IntN(20), LayerBytes: 1 << 20}
		st, _, err := Place(req, o)
		st2, _, err2 := Place(req, append([]Offer(nil), o...))
		if (err == nil) != (err2 == nil) || fmt.Sprint(st) != fmt.Sprint(st2) {
			t.Fatal("not deterministic")
		}
		if err != nil {
			if !errors.Is(err, ErrInsufficient) {
				t.Fatal(err)
			}
			continue
		}
		mem := map[string]uint64{}
		for _, x := range o {
			mem[x.PeerID] = x.MemoryBytes
		}
		next := 0
		for _, s := range st {
			if s.First != next || s.Last <= s.First {
				t.Fatalf("bad stage %+v", s)
			}
			next = s.Last
			for _, p := range s.Replicas {
				if uint64(s.Last-s.First)*req.LayerBytes > mem[p] {
					t.Fatalf("%s given %d layers with %d bytes", p, s.Last-s.First, mem[p])
				}
			}
		}
		if next != req.Layers {
			t.Fatalf("placed %d of %d layers", next, req.Layers)
		}
	}
}

func TestReplace(t *testing.T) {
	o := offers(30, 20, 10, 5)
	req := PlaceRequest{Researcher: "r", Stages: 3, Replicas: 1, Layers: 6, LayerBytes: 1 << 20}
	st, spares, err := Place(req, o)
	if err != nil {
		t.Fatal(err)
	}
	dead := st[1].Replicas[0]
	st2, spares2, err := Replace(st, spares, dead, o, req)
	if err != nil {
		t.Fatal(err)
	}
	if st2[1].Replicas[0] != "p03" || len(spares2) != 0 || st2[1].First != st[1].First || st2[1].Last != st[1].Last {
		t.Fatalf("replace: %+v spares %v", st2, spares2)
	}
	if _, _, err := Replace(st2, spares2, st2[0].Replicas[0], o, req); !errors.Is(err, ErrInsufficient) {
		t.Fatalf("no spares left: got %v", err)
	}
	// With replicas, a lost replica just drops out.
	req.Replicas = 2
	req.Stages = 2
	st, spares, _ = Place(req, o)
	st2, _, err = Replace(st, spares, st[0].Replicas[0], o, req)
	if err != nil || len(st2[0].Replicas) != 1 {
		t.Fatalf("replica drop: %v %+v", err, st2)
	}
}

// TestReplaceNeverNamesAPeerTwice: a spare list that still holds a placed
// peer (as one rebuilt by a coordinator that took the job over) must not
// give that peer a second stage: the plan would be refused "appears twice"
// on every retry, as the container e2e showed after two losses and a
// coordinator change.
func TestReplaceNeverNamesAPeerTwice(t *testing.T) {
	o := offers(30, 20, 10, 5)
	req := PlaceRequest{Researcher: "r", Stages: 3, Replicas: 1, Layers: 6, LayerBytes: 1 << 20}
	st, spares, err := Place(req, o)
	if err != nil {
		t.Fatal(err)
	}
	stale := append(slices.Clone(spares), st[0].Replicas[0], st[2].Replicas[0])
	st2, _, err := Replace(st, stale, st[1].Replicas[0], o, req)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range st2 {
		for _, r := range s.Replicas {
			if seen[r] {
				t.Fatalf("%s holds two stages: %+v", r, st2)
			}
			seen[r] = true
		}
	}
}
