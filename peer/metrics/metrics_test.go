package metrics

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/holopeer/holopeer/peer/api"
)

// scrape fetches /metrics over HTTP, as Prometheus would, and parses the
// text format.
func scrape(t *testing.T, m *Metrics) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q, want the text format", ct)
	}
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("not the Prometheus text format: %v\n%s", err, body)
	}
	return fams, string(body)
}

// value finds the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("%s has no sample with %v", name, want)
	return 0
}

func TestPushed(t *testing.T) {
	m := New()
	m.SetPeers(map[string]int{"direct": 3, "relayed": 1})
	m.HolePunch(true)
	m.HolePunch(false)
	m.HolePunch(true)
	m.SetCoordinator("12D3KooWcoord", 3, "sim", true)
	m.SetCoordinator("12D3KooWcoord", 3, "sim", true) // no change
	m.SetTerm(4)
	m.ObserveStep("job-1", 1, 120*time.Millisecond)
	m.ObserveStep("job-1", 1, 80*time.Millisecond)
	m.AddBytes("lowrank", 1000)
	m.AddBytes("lowrank", 24)
	m.AddBytes("fp32", 4096)
	m.AddTokens("job-1", 512)
	m.SetTokensPerS("job-1", 812.5)
	m.Refused("holopeer/lab/presence", "stale")
	m.Refused("holopeer/lab/presence", "stale")
	m.Reject("stage", "bad-shape")
	m.Receipt("kept")

	fams, body := scrape(t, m)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"holopeer_peers", map[string]string{"conn": "direct"}, 3},
		{"holopeer_peers", map[string]string{"conn": "relayed"}, 1},
		{"holopeer_hole_punch_total", map[string]string{"result": "success"}, 2},
		{"holopeer_hole_punch_total", map[string]string{"result": "failure"}, 1},
		{"holopeer_election_term", nil, 4},
		{"holopeer_coordinator_changes_total", nil, 2},
		{"holopeer_coordinator_info", map[string]string{"peer_id": "12D3KooWcoord", "insecure": "true"}, 1},
		{"holopeer_stage_step_seconds", map[string]string{"job": "job-1", "stage": "1"}, 2},
		{"holopeer_bytes_sent_total", map[string]string{"codec": "lowrank"}, 1024},
		{"holopeer_bytes_sent_total", map[string]string{"codec": "fp32"}, 4096},
		{"holopeer_tokens_processed_total", map[string]string{"job": "job-1"}, 512},
		{"holopeer_job_tokens_per_second", map[string]string{"job": "job-1"}, 812.5},
		{"holopeer_refused_total", map[string]string{"protocol": "holopeer/lab/presence", "reason": "stale"}, 2},
		{"holopeer_refused_total", map[string]string{"protocol": "stage", "reason": "bad-shape"}, 1},
		{"holopeer_ledger_receipts_total", map[string]string{"result": "kept"}, 1},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
	if !strings.Contains(body, "# HELP holopeer_peers ") || !strings.Contains(body, "# TYPE holopeer_stage_step_seconds histogram") {
		t.Errorf("help or type lines missing:\n%s", body)
	}
	// Naming follows Prometheus conventions.
	problems, err := promlint.NewWithMetricFamilies(families(fams)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, Namespace) {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func families(m map[string]*dto.MetricFamily) []*dto.MetricFamily {
	var out []*dto.MetricFamily
	for _, f := range m {
		out = append(out, f)
	}
	return out
}

func TestPulledAtScrape(t *testing.T) {
	st := api.Status{
		PeerID: "12D3KooWself", Swarm: "lab", Version: "dev", Backend: "cpu", TEE: "none", Reachability: "public",
		Peers:       []api.PeerStatus{{PeerID: "a", Conn: "direct"}, {PeerID: "b", Conn: "direct"}, {PeerID: "c", Conn: "relayed"}},
		Coordinator: &api.Coordinator{PeerID: "12D3KooWcoord", Term: 7, TEE: "sim", Insecure: true},
	}
	jobs := []api.JobStatus{{JobID: "j1", Step: 12, TokensPerS: 1500, Loss: []api.Point{{X: 1, Y: 5.5}, {X: 12, Y: 3.25}}}}
	m := New(WithoutRuntime(), WithStatus(func() api.Status { return st }), WithJobs(func() []api.JobStatus { return jobs }))
	m.SetPeers(map[string]int{"direct": 99}) // ignored: the status wins

	fams, _ := scrape(t, m)
	if _, ok := fams["go_goroutines"]; ok {
		t.Error("WithoutRuntime still registered the Go collector")
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"holopeer_peers", map[string]string{"conn": "direct"}, 2},
		{"holopeer_peers", map[string]string{"conn": "relayed"}, 1},
		{"holopeer_election_term", nil, 7},
		{"holopeer_coordinator_info", map[string]string{"tee": "sim", "insecure": "true"}, 1},
		{"holopeer_node_info", map[string]string{"peer_id": "12D3KooWself", "reachability": "public"}, 1},
		{"holopeer_job_tokens_per_second", map[string]string{"job": "j1"}, 1500},
		{"holopeer_job_step", map[string]string{"job": "j1"}, 12},
		{"holopeer_job_loss", map[string]string{"job": "j1"}, 3.25},
		{"holopeer_coordinator_changes_total", nil, 1},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// A new term seen by a scrape, and pushed too, counts once.
	st.Coordinator = &api.Coordinator{PeerID: "12D3KooWother", Term: 8, TEE: "sev-snp"}
	m.SetCoordinator("12D3KooWother", 8, "sev-snp", false)
	fams, _ = scrape(t, m)
	fams, _ = scrape(t, m)
	if got := value(t, fams, "holopeer_coordinator_changes_total", nil); got != 2 {
		t.Errorf("coordinator changes %v, want 2", got)
	}
	if got := value(t, fams, "holopeer_coordinator_info", map[string]string{"insecure": "false"}); got != 1 {
		t.Errorf("new coordinator not shown")
	}
}

func TestLabelCaps(t *testing.T) {
	var jobs []api.JobStatus
	for i := range 3 * MaxJobs {
		jobs = append(jobs, api.JobStatus{JobID: fmt.Sprintf("job-%d", i), TokensPerS: 1})
	}
	jobs = append(jobs, api.JobStatus{JobID: "job-0"}, api.JobStatus{JobID: strings.Repeat("é", 100)})
	m := New(WithoutRuntime(), WithJobs(func() []api.JobStatus { return jobs }))
	for i := range 3 * MaxJobs {
		m.AddTokens(fmt.Sprintf("job-%d", i), 1)
		m.Reject("t", fmt.Sprintf("reason-%d", i*10))
	}
	m.AddBytes("\xff\xfe"+strings.Repeat("x", 200), 1) // invalid UTF-8, too long: still scrapes
	fams, _ := scrape(t, m)
	if n := len(fams["holopeer_tokens_processed_total"].Metric); n != MaxJobs+1 {
		t.Errorf("%d token series, want %d (the rest under job=other)", n, MaxJobs+1)
	}
	if got := value(t, fams, "holopeer_tokens_processed_total", map[string]string{"job": "other"}); got != 2*MaxJobs {
		t.Errorf("job=other counted %v", got)
	}
	if n := len(fams["holopeer_job_tokens_per_second"].Metric); n != MaxJobs {
		t.Errorf("%d pulled job series, want %d", n, MaxJobs)
	}
	m.ForgetJob("job-1")
	m.AddTokens("job-new", 1)
	fams, _ = scrape(t, m)
	if got := value(t, fams, "holopeer_tokens_processed_total", map[string]string{"job": "job-new"}); got != 1 {
		t.Errorf("a forgotten job's slot was not reused")
	}
}

func TestTwoNodesInOneProcess(t *testing.T) {
	a, b := New(), New()
	a.AddBytes("fp32", 1)
	fa, _ := scrape(t, a)
	fb, _ := scrape(t, b)
	if value(t, fa, "holopeer_bytes_sent_total", map[string]string{"codec": "fp32"}) != 1 {
		t.Error("a lost its count")
	}
	if f, ok := fb["holopeer_bytes_sent_total"]; ok && len(f.Metric) > 0 {
		t.Error("b sees a's bytes: registries are shared")
	}
}
