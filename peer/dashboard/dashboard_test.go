package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/dashboard"
)

// serve starts a dashboard over src on a real loopback server, mounted as
// the node mounts it.
func serve(t *testing.T, src dashboard.Source, opts ...dashboard.Option) (*dashboard.Dashboard, string) {
	t.Helper()
	d, err := dashboard.New(src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { api.WriteJSON(w, 200, src.Status()) })
	mux.Handle("/", d)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		d.Close()
		srv.Close()
	})
	return d, srv.URL
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func trained(t *testing.T, steps int) *swarmSource {
	src := newSwarmSource(t)
	for range steps {
		src.Step(t)
	}
	return src
}

func TestPageAndRoutes(t *testing.T) {
	src := trained(t, 3)
	_, base := serve(t, src)
	for _, c := range []struct {
		path, ctype string
		code        int
	}{
		{"/", "text/html", 200},
		{"/dashboard/", "text/html", 200},
		{"/dashboard", "", 301},
		{"/dashboard/static/app.js", "javascript", 200},
		{"/dashboard/static/style.css", "text/css", 200},
		{"/dashboard/static/icon.svg", "image/svg+xml", 200},
		{"/dashboard/state.json", "application/json", 200},
		{"/dashboard/bytes.svg", "image/svg+xml", 200},
		{"/v1/status", "application/json", 200},
		{"/favicon.ico", "", 404},
		{"/v1/nothing", "", 404},
		{"/dashboard.go", "", 404},
		{"/dashboard/static/dashboard.go", "", 404},
	} {
		resp, _ := get(t, base+c.path)
		if resp.StatusCode != c.code || !strings.Contains(resp.Header.Get("Content-Type"), c.ctype) {
			t.Errorf("%s: %d %q, want %d %q", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), c.code, c.ctype)
		}
	}
	resp, body := get(t, base+"/")
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "connect-src 'self'", "img-src 'self'", "script-src 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if !strings.Contains(string(body), `name="viewport"`) {
		t.Error("no viewport meta: unreadable on a phone")
	}
}

// The page itself names no other host: every asset is ours.
func TestAssetsNameNoOtherHost(t *testing.T) {
	src := trained(t, 1)
	_, base := serve(t, src)
	for _, p := range []string{"/", "/dashboard/static/app.js", "/dashboard/static/style.css", "/dashboard/static/icon.svg"} {
		_, body := get(t, base+p)
		s := strings.ReplaceAll(string(body), "http://www.w3.org/2000/svg", "") // the SVG namespace is a name, not a request
		if strings.Contains(s, "http://") || strings.Contains(s, "https://") || strings.Contains(s, "src=\"//") || strings.Contains(s, "url(") {
			t.Errorf("%s refers to another host", p)
		}
	}
	_ = fs.ValidPath
}

func TestState(t *testing.T) {
	src := trained(t, 100) // 25 s of clock: two rounds of receipts
	_, base := serve(t, src)
	_, body := get(t, base+dashboard.PathState)
	var st dashboard.State
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Fleet) != 5 || !st.Fleet[0].Self || st.Fleet[0].PeerID != src.self.id {
		t.Fatalf("fleet: %+v", st.Fleet)
	}
	insecure, relayed, coordinators := 0, 0, 0
	for _, r := range st.Fleet {
		if r.Insecure {
			insecure++
		}
		if r.Conn == "relayed" {
			relayed++
		}
		if r.Coordinator {
			coordinators++
		}
	}
	if insecure != 2 || relayed != 1 || coordinators != 1 {
		t.Errorf("fleet: %d insecure, %d relayed, %d coordinators", insecure, relayed, coordinators)
	}
	if c := st.Coordinator; c == nil || c.Term != 3 || !c.Insecure {
		t.Fatalf("coordinator: %+v", c)
	}
	if len(st.Jobs) != 1 || st.Jobs[0].LossPoints != 100 || st.Jobs[0].LastLoss == nil || st.Jobs[0].Step != 100 {
		t.Fatalf("jobs: %+v", st.Jobs)
	}
	if len(st.Bytes) != 2 || st.Bytes[0].Codec != "lowrank" || st.Bytes[0].Bytes <= st.Bytes[1].Bytes {
		t.Fatalf("bytes: %+v", st.Bytes)
	}
	if len(st.Leaderboard) != 5 {
		t.Fatalf("leaderboard: %+v", st.Leaderboard)
	}
	for _, e := range st.Leaderboard {
		if e.Points <= 0 || e.Receipts == 0 {
			t.Errorf("leaderboard entry without credit: %+v", e)
		}
	}
	// The loss fell: the curve is a real fit.
	j := src.Jobs()[0]
	if first, last := j.Loss[0].Y, j.Loss[len(j.Loss)-1].Y; !(last < first/4) {
		t.Errorf("loss went from %.3f to %.3f", first, last)
	}
}

// svgPaths returns the d attributes of the paths drawn in colour.
func svgPaths(t *testing.T, b []byte, colour string) []string {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(string(b)))
	var out []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "path" {
			continue
		}
		var d, style string
		for _, a := range se.Attr {
			switch a.Name.Local {
			case "d":
				d = a.Value
			case "style":
				style = a.Value
			}
		}
		if strings.Contains(strings.ToLower(style), "stroke:"+strings.ToLower(colour)) {
			out = append(out, d)
		}
	}
}

func TestLossChart(t *testing.T) {
	src := trained(t, 30)
	_, base := serve(t, src)
	resp, body := get(t, base+dashboard.PathLoss+"?job=job-7f3a")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/svg+xml" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n, _ := strconv.Atoi(resp.Header.Get("X-Chart-Points")); n != 30 {
		t.Errorf("chart says %d points, want 30", n)
	}
	// The curve is one stroked path through all 30 points.
	longest := 0
	for _, d := range svgPaths(t, body, "#2563eb") {
		longest = max(longest, strings.Count(d, "L")+1)
	}
	if longest != 30 {
		t.Errorf("longest loss path has %d vertices, want 30", longest)
	}
	for _, c := range []struct {
		q    string
		code int
	}{{"", 400}, {"?job=nope", 404}, {"?job=" + strings.Repeat("x", 300), 400}} {
		if resp, _ := get(t, base+dashboard.PathLoss+c.q); resp.StatusCode != c.code {
			t.Errorf("loss.svg%s: %d, want %d", c.q, resp.StatusCode, c.code)
		}
	}
	resp, body = get(t, base+dashboard.PathThroughput+"?job=job-7f3a")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "tokens/s") {
		t.Errorf("throughput chart: %d", resp.StatusCode)
	}
}

// hostile is a source whose peers and jobs carry markup and oversized
// strings, as a malicious peer's records might.
type hostile struct{ *swarmSource }

func (h hostile) Jobs() []api.JobStatus {
	js := h.swarmSource.Jobs()
	js[0].Name = `<img src=x onerror=alert(1)>` + strings.Repeat("A", 5000)
	js[0].BytesSent[`<script>alert(1)</script>`] = 1 << 20
	return js
}

func TestHostileStrings(t *testing.T) {
	src := hostile{trained(t, 3)}
	_, base := serve(t, src)
	_, body := get(t, base+dashboard.PathState)
	var st dashboard.State
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Jobs[0].Name) > 200 {
		t.Errorf("a 5000-byte name reached the page whole")
	}
	_, svg := get(t, base+dashboard.PathBytes)
	if strings.Contains(string(svg), "<script") {
		t.Error("a codec name became markup in the bytes chart")
	}
	svgPaths(t, svg, "none") // still well-formed XML
}

func TestEvents(t *testing.T) {
	src := trained(t, 2)
	d, base := serve(t, src, dashboard.WithInterval(5*time.Millisecond), dashboard.WithClock(src.clock))
	resp, err := http.Get(base + dashboard.PathEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := make(chan dashboard.State, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var st dashboard.State
				if json.Unmarshal([]byte(data), &st) == nil {
					events <- st
				}
			}
		}
	}()
	first := <-events
	if first.Jobs[0].Step != 2 {
		t.Fatalf("first event at step %d", first.Jobs[0].Step)
	}
	src.Step(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		select {
		case st := <-events:
			if st.Jobs[0].Step == 3 {
				// Closing the dashboard ends the stream.
				go d.Close()
				for range events {
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no event after the job advanced")
		}
	}
}

func TestStreamLimit(t *testing.T) {
	src := trained(t, 1)
	_, base := serve(t, src, dashboard.WithMaxStreams(1))
	first, err := http.Get(base + dashboard.PathEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	second, _ := get(t, base+dashboard.PathEvents)
	if second.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second stream: %d, want 503 (the page then polls)", second.StatusCode)
	}
}

// empty is a node that just started: no peers, no coordinator, no jobs.
type empty struct{}

func (empty) Status() api.Status             { return api.Status{PeerID: "12D3KooWlonely", Swarm: "lab"} }
func (empty) Jobs() []api.JobStatus          { return nil }
func (empty) Leaderboard() []api.LedgerEntry { return nil }

func TestFreshNode(t *testing.T) {
	_, base := serve(t, empty{})
	_, body := get(t, base+dashboard.PathState)
	var st map[string]any
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if st["coordinator"] != nil || len(st["fleet"].([]any)) != 1 || len(st["jobs"].([]any)) != 0 || len(st["leaderboard"].([]any)) != 0 {
		t.Fatalf("fresh node state: %s", body)
	}
	if resp, _ := get(t, base+dashboard.PathBytes); resp.StatusCode != 200 {
		t.Fatalf("bytes chart with nothing sent: %d", resp.StatusCode)
	}
}
