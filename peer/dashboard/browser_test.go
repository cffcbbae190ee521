package dashboard_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/holopeer/holopeer/peer/dashboard"
	"github.com/holopeer/holopeer/peer/dashboard/browsertest"
)

// TestBrowser loads the dashboard in headless Chromium and waits until it
// shows every node of the fleet, a coordinator and a loss curve of at
// least two points, then saves screenshots (desktop and phone) and logs
// their paths.
//
// By default it serves a dashboard over an in-process swarm whose job
// trains while the page watches. To check a real swarm instead, start
// `holopeer testnet` and set
//
//	HOLOPEER_DASHBOARD_URL=http://127.0.0.1:7601/  HOLOPEER_DASHBOARD_NODES=<stage nodes + 1>
//
// Screenshots go to $HOLOPEER_SCREENSHOT_DIR (default: a holopeer-dashboard
// folder in the system temp dir, kept after the test for CI to collect).
// Skips when no Chromium is installed (apt-get install chromium).
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser; skipped with -short")
	}
	if _, err := browsertest.FindChromium(); errors.Is(err, browsertest.ErrNoChromium) {
		t.Skip("no chromium on this machine (install it with: apt-get install -y --no-install-recommends chromium fonts-liberation)")
	}
	dir := os.Getenv("HOLOPEER_SCREENSHOT_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "holopeer-dashboard")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pageURL := os.Getenv("HOLOPEER_DASHBOARD_URL")
	exp := browsertest.Expect{Nodes: 5, MinLossPoints: 2, Coordinator: true, Insecure: true}
	name := "dashboard"
	if pageURL != "" {
		if _, err := url.Parse(pageURL); err != nil {
			t.Fatalf("HOLOPEER_DASHBOARD_URL: %v", err)
		}
		exp.Insecure = false // a real swarm may or may not be a sim testnet
		exp.Nodes = 1
		if n, err := strconv.Atoi(os.Getenv("HOLOPEER_DASHBOARD_NODES")); err == nil {
			exp.Nodes = n
		}
		name = "dashboard-swarm"
	} else {
		src := newSwarmSource(t)
		for range 40 { // some history before the page opens
			src.Step(t)
		}
		_, base := serve(t, src, dashboard.WithInterval(200*time.Millisecond), dashboard.WithClock(src.clock))
		pageURL = base + "/"
		// The job keeps training while the browser watches.
		done := make(chan struct{})
		stepped := make(chan struct{})
		go func() {
			defer close(stepped)
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					src.Step(t)
				}
			}
		}()
		defer func() { close(done); <-stepped }()
	}

	res, err := browsertest.Check(ctx, pageURL, exp, browsertest.Options{Dir: dir, Name: name, Timeout: 60 * time.Second})
	t.Logf("page showed %+v", res.Seen)
	if res.Desktop != "" {
		t.Logf("screenshot (desktop): %s", res.Desktop)
	}
	if res.Phone != "" {
		t.Logf("screenshot (phone):   %s", res.Phone)
	}
	if err != nil {
		t.Fatal(err)
	}
}
