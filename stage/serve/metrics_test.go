package serve

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func family(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestMetrics: every request is counted with its job, endpoint and
// status; errors by code; and each generated token feeds the latency and
// speed histograms.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixture(t, func(c *Config) { c.Metrics, c.Job = reg, "job-a" })
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"Once","max_tokens":10,"temperature":0,"n":2}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	r := decodeCompletion(t, body)
	post(t, f.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)

	requests := family(t, reg, "holopeer_serve_requests_total")
	got := map[string]float64{}
	for _, m := range requests.Metric {
		l := map[string]string{}
		for _, p := range m.Label {
			l[p.GetName()] = p.GetValue()
		}
		if l["job"] != "job-a" {
			t.Fatalf("labels %v", l)
		}
		got[l["endpoint"]+" "+l["status"]] = m.GetCounter().GetValue()
	}
	if got["/v1/completions 200"] != 1 || got["/v1/chat/completions 400"] != 1 {
		t.Fatalf("requests %v", got)
	}
	errs := family(t, reg, "holopeer_serve_errors_total")
	if len(errs.Metric) != 1 || errs.Metric[0].GetCounter().GetValue() != 1 || !strings.Contains(errs.Metric[0].String(), "unsupported") {
		t.Fatalf("errors %v", errs)
	}
	produced := uint64(r.Usage.CompletionTokens)
	if n := family(t, reg, "holopeer_serve_time_to_first_token_seconds").Metric[0].GetHistogram().GetSampleCount(); n != 2 {
		t.Fatalf("%d first tokens for 2 choices", n)
	}
	if n := family(t, reg, "holopeer_serve_inter_token_latency_seconds").Metric[0].GetHistogram().GetSampleCount(); n != produced-2 {
		t.Fatalf("%d gaps between %d tokens of 2 choices", n, produced)
	}
	if n := family(t, reg, "holopeer_serve_tokens_per_second").Metric[0].GetHistogram().GetSampleCount(); n != 2 {
		t.Fatalf("%d speeds for 2 choices", n)
	}
	tokens := family(t, reg, "holopeer_serve_tokens_total")
	for _, m := range tokens.Metric {
		if strings.Contains(m.String(), `"completion"`) && m.GetCounter().GetValue() != float64(produced) {
			t.Fatalf("tokens %v, usage %d", m, produced)
		}
	}
	// A second job's API registers beside the first; the same job twice
	// is refused.
	if _, err := New(Config{Model: "tiny", Engine: f.engine, Tokenizer: byteTok(), Vocab: 257, ContextTokens: 64, Metrics: reg, Job: "job-b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Model: "tiny", Engine: f.engine, Tokenizer: byteTok(), Vocab: 257, ContextTokens: 64, Metrics: reg, Job: "job-a"}); err == nil {
		t.Fatal("the same job's metrics registered twice")
	}
}
