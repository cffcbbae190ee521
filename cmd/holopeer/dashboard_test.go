package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/dashboard/browsertest"
)

var dashboardRE = regexp.MustCompile(`dashboard: (http://\S+/)`)

// TestTestnetDashboardAndLedger runs `holopeer testnet --keep`, then, while
// the swarm is still up: a headless Chromium loads a node's dashboard and
// waits for the fleet, the (INSECURE) coordinator and the job's loss curve;
// `holopeer ledger top` lists every stage node with points, from the
// receipts the coordinator signed; and /metrics answers in the Prometheus
// format.
func TestTestnetDashboardAndLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a swarm of processes")
	}
	chrome, err := browsertest.FindChromium()
	if err != nil {
		t.Skipf("no Chromium to drive (install Debian's chromium): %v", err)
	}
	dir := t.TempDir()
	man := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(man, []byte(tinySwarmJob), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "testnet", "--manifest", man, "--nodes", "5", "--keep", "--data-dir", filepath.Join(dir, "swarm"), "--swarm", "dash")
	var url string
	eventually(t, 3*time.Minute, "the testnet finishes its job and prints the dashboard", func() error {
		select {
		case <-p.done:
			return fmt.Errorf("testnet exited: %s", tail(p.errOut(), 20))
		default:
		}
		m := dashboardRE.FindStringSubmatch(p.out())
		if m == nil || !regexp.MustCompile(`swarm running`).MatchString(p.out()) {
			return fmt.Errorf("not yet")
		}
		url = m[1]
		return nil
	})
	apiAddr := regexp.MustCompile(`http://([^/]+)/`).FindStringSubmatch(url)[1]

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shots := os.Getenv("HOLOPEER_SCREENSHOT_DIR")
	if shots == "" {
		shots = filepath.Join(dir, "shots")
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := browsertest.Check(ctx, url, browsertest.Expect{Nodes: 6, MinLossPoints: 2, Coordinator: true, Insecure: true},
		browsertest.Options{Dir: shots, Name: "testnet", Chrome: chrome})
	if err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	t.Logf("dashboard screenshots: %s %s", res.Desktop, res.Phone)

	// Every stage node of the job earned points, verified from receipts.
	var jobs []api.JobStatus
	if err := (api.Client{Addr: apiAddr}).GetJSON(ctx, "/v1/jobs", &jobs); err != nil || len(jobs) == 0 {
		t.Fatalf("jobs: %v %v", jobs, err)
	}
	out, err := exec.CommandContext(ctx, binPath, "ledger", "top", "--api", apiAddr, "--json", "-n", "0").Output()
	if err != nil {
		t.Fatalf("ledger top: %v\n%s", err, out)
	}
	var top []api.LedgerEntry
	if err := json.Unmarshal(out, &top); err != nil {
		// The JSON may wrap the list; accept either form.
		var wrapped struct {
			Top []api.LedgerEntry `json:"top"`
		}
		if err2 := json.Unmarshal(out, &wrapped); err2 != nil {
			t.Fatalf("ledger top --json: %v\n%s", err, out)
		}
		top = wrapped.Top
	}
	points := map[string]float64{}
	for _, e := range top {
		points[e.PeerID] = e.Points
	}
	for _, s := range jobs[0].Stages {
		for _, r := range s.Replicas {
			if points[r] <= 0 {
				t.Errorf("stage node %s has no points in %s", r, out)
			}
		}
	}
	resp, err := exec.CommandContext(ctx, "curl", "-sf", "http://"+apiAddr+"/metrics").Output()
	if err == nil && !regexp.MustCompile(`(?m)^holopeer_`).Match(resp) {
		t.Errorf("/metrics has no holopeer metrics:\n%.500s", resp)
	}
}
