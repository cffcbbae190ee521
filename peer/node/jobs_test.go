package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/peer/api"
)

func peerID(t *testing.T) string {
	t.Helper()
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	return id.String()
}

func report(t *testing.T, st api.JobStatus) []byte {
	t.Helper()
	b, err := json.Marshal(jobUpdate{Type: "progress", Job: &st})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestJobStatusSpoofing performs finding 9a: an honest job reports a
// 143-point loss curve; then another peer gossips, as itself, a report
// under the honest job's id naming itself researcher, state failed, with
// one point at step 0 (which rolled the curve back to 1 point). The book
// must keep the honest job's owner, state and curve, also after the
// attacker pushes the job out of the book with fake jobs of its own.
func TestJobStatusSpoofing(t *testing.T) {
	var b jobBook
	honest, attacker := peerID(t), peerID(t)
	const id = "victim-0123456789ab"
	for step := 1; step <= 143; step += 11 {
		var pts []api.Point
		for x := step; x < step+11 && x <= 143; x++ {
			pts = append(pts, api.Point{X: float64(x), Y: 5 - float64(x)/100})
		}
		st := api.JobStatus{JobID: id, Name: "victim", State: "running", Researcher: honest, Loss: pts, Updated: time.Now()}
		if err := b.takeReport(honest, report(t, st)); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		for _, j := range b.list() {
			if j.JobID != id {
				continue
			}
			if j.Researcher != honest || j.State != "running" || len(j.Loss) != 143 {
				t.Fatalf("%s: job shows researcher %s, state %s, %d points", when, j.Researcher, j.State, len(j.Loss))
			}
			return
		}
		t.Fatalf("%s: the honest job is gone", when)
	}
	check("before")

	spoof := api.JobStatus{JobID: id, Name: "victim", State: "failed", Researcher: attacker, Loss: []api.Point{{X: 0, Y: 99}}, Updated: time.Now()}
	if err := b.takeReport(attacker, report(t, spoof)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("spoofed report under the attacker's own name: %v", err)
	}
	spoof.Researcher = honest // and naming the honest researcher
	if err := b.takeReport(attacker, report(t, spoof)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("spoofed report naming the honest researcher: %v", err)
	}
	check("after the spoof")

	// Evict the honest job with fake ones, then report under its id.
	for i := range maxJobs {
		fake := api.JobStatus{JobID: fmt.Sprintf("fake-%d", i), Researcher: attacker, Updated: time.Now().Add(time.Hour)}
		if err := b.takeReport(attacker, report(t, fake)); err != nil {
			t.Fatal(err)
		}
	}
	spoof.Researcher = attacker
	if err := b.takeReport(attacker, report(t, spoof)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("spoofed report after evicting the job: %v", err)
	}
	for _, j := range b.list() {
		if j.JobID == id {
			t.Fatalf("the attacker's report re-created the evicted job: %+v", j)
		}
	}
	// The owner still reports on its job, and may roll its own curve back.
	back := api.JobStatus{JobID: id, State: "running", Researcher: honest, Loss: []api.Point{{X: 100, Y: 4}}, Updated: time.Now()}
	if err := b.takeReport(honest, report(t, back)); err != nil {
		t.Fatalf("the owner's report after eviction: %v", err)
	}
}

func FuzzTakeReport(f *testing.F) {
	f.Add("a", []byte(`{"type":"progress","job":{"job_id":"j","researcher":"a","loss":[{"x":1,"y":2}]}}`))
	f.Add("b", []byte(`{"type":"progress","job":{"job_id":"j","researcher":"a"}}`))
	f.Fuzz(func(t *testing.T, from string, payload []byte) {
		var b jobBook
		_ = b.takeReport("a", []byte(`{"type":"progress","job":{"job_id":"j","researcher":"a","loss":[{"x":1,"y":2}]}}`))
		if err := b.takeReport(from, payload); err == nil && from != "a" {
			for _, j := range b.list() {
				if j.JobID == "j" && (j.Researcher != "a" || len(j.Loss) != 1) {
					t.Fatalf("a report from %q changed job j: %+v", from, j)
				}
			}
		}
	})
}
