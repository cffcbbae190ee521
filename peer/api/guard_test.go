package api_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/ledger"
	"github.com/holopeer/holopeer/peer/metrics"
)

// node is a control API on a real loopback socket with the routes a node
// mounts: status, jobs, the real metrics and ledger handlers, and a probe
// that counts the times it ran.
type node struct {
	srv     *api.Server
	addr    string
	port    string
	token   string
	probes  atomic.Int64
	mu      sync.Mutex
	refused []string
}

func startNode(t *testing.T, opts ...api.Option) *node {
	t.Helper()
	dir := t.TempDir()
	tok, err := api.LoadOrCreateToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{token: tok}
	opts = append([]api.Option{api.WithToken(tok), api.WithRefusals(func(r string) {
		n.mu.Lock()
		n.refused = append(n.refused, r)
		n.mu.Unlock()
	})}, opts...)
	n.srv = api.NewServer(func() api.Status { return api.Status{PeerID: "12D3KooWsecret", Swarm: "lab"} }, slog.New(slog.DiscardHandler), opts...)
	l, err := ledger.Open(dir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	n.srv.Handle("GET /v1/jobs", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusOK, []api.JobStatus{{JobID: "job-secret"}})
	}))
	n.srv.Handle("GET /metrics", metrics.New(metrics.WithoutRuntime()).Handler())
	n.srv.Handle("GET /v1/ledger/", l.Handler())
	n.srv.Handle("POST /v1/probe", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.probes.Add(1)
		io.Copy(io.Discard, r.Body)
		api.WriteJSON(w, http.StatusOK, api.ProbeResult{Peer: "p"})
	}))
	if err := n.srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.srv.Close(context.Background()) })
	n.addr = n.srv.Addr()
	_, n.port, _ = net.SplitHostPort(n.addr)
	return n
}

type req struct {
	method, path, host, origin, ctype, auth, secFetch, body string
}

func (n *node) do(t *testing.T, r req) (int, string) {
	t.Helper()
	hr, err := http.NewRequest(r.method, "http://"+n.addr+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.host != "" {
		hr.Host = r.host
	}
	for k, v := range map[string]string{"Origin": r.origin, "Content-Type": r.ctype, "Authorization": r.auth, "Sec-Fetch-Site": r.secFetch} {
		if v != "" {
			hr.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var reads = []string{"/v1/status", "/v1/jobs", "/metrics", "/v1/ledger/top", "/v1/ledger/receipts", "/v1/ledger/terms"}

// DNS rebinding: a page on attacker.example re-points its name at
// 127.0.0.1 and reads the API as same-origin. The Host it sends is its
// own name, and every endpoint refuses it.
func TestAttackDNSRebindingIsRefused(t *testing.T) {
	n := startNode(t)
	for _, host := range []string{"attacker.example", "attacker.example:" + n.port, "127.0.0.1.attacker.example:" + n.port, "localhost.attacker.example", "LOCALHOST.evil:80"} {
		for _, p := range reads {
			code, body := n.do(t, req{method: "GET", path: p, host: host})
			if code != http.StatusForbidden || strings.Contains(body, "secret") || strings.Contains(body, "holopeer_") {
				t.Fatalf("GET %s with Host %s: %d %q", p, host, code, body)
			}
		}
		code, _ := n.do(t, req{method: "POST", path: "/v1/probe", host: host, ctype: "application/json", auth: "Bearer " + n.token, body: `{"peer":"x"}`})
		if code != http.StatusForbidden {
			t.Fatalf("POST probe with Host %s: %d", host, code)
		}
	}
	if n.probes.Load() != 0 {
		t.Fatal("a rebinding page ran a probe")
	}
	for _, host := range []string{"", "localhost:" + n.port, "127.0.0.1:" + n.port, "[::1]:" + n.port, "LocalHost."} {
		for _, p := range reads {
			if code, body := n.do(t, req{method: "GET", path: p, host: host}); code != http.StatusOK {
				t.Fatalf("GET %s with Host %q: %d %s", p, host, code, body)
			}
		}
	}
}

// A page on another site posts text/plain (a "simple" request, sent
// without a CORS preflight) to /v1/probe: it is refused before the probe
// runs, and so is every other way in short of the token and JSON.
func TestAttackCrossSiteProbeIsRefused(t *testing.T) {
	n := startNode(t)
	body := `{"peer":"12D3KooWvictim","bytes":67108864}`
	for _, c := range []struct {
		name string
		r    req
		want int
	}{
		{"cross-site text/plain", req{origin: "http://attacker.example", ctype: "text/plain"}, http.StatusForbidden},
		{"cross-site form", req{origin: "https://attacker.example", ctype: "application/x-www-form-urlencoded"}, http.StatusForbidden},
		{"null origin", req{origin: "null", ctype: "text/plain"}, http.StatusForbidden},
		{"sec-fetch cross-site", req{secFetch: "cross-site", ctype: "application/json", auth: "Bearer " + n.token}, http.StatusForbidden},
		{"text/plain without origin", req{ctype: "text/plain;charset=UTF-8", auth: "Bearer " + n.token}, http.StatusUnsupportedMediaType},
		{"no content type", req{auth: "Bearer " + n.token}, http.StatusUnsupportedMediaType},
		{"json without token", req{ctype: "application/json"}, http.StatusUnauthorized},
		{"json with a wrong token", req{ctype: "application/json", auth: "Bearer " + strings.Repeat("0", 64)}, http.StatusUnauthorized},
		{"json with the token as basic", req{ctype: "application/json", auth: "Basic " + n.token}, http.StatusUnauthorized},
		{"another local port's page", req{origin: "http://127.0.0.1:1", ctype: "application/json", auth: "Bearer " + n.token}, http.StatusForbidden},
	} {
		c.r.method, c.r.path, c.r.body = "POST", "/v1/probe", body
		if code, msg := n.do(t, c.r); code != c.want {
			t.Fatalf("%s: %d %s, want %d", c.name, code, msg, c.want)
		}
	}
	if got := n.probes.Load(); got != 0 {
		t.Fatalf("refused requests ran %d probes", got)
	}
	// The CLI's request, and the dashboard's (same origin), go through.
	if code, msg := n.do(t, req{method: "POST", path: "/v1/probe", ctype: "application/json; charset=utf-8", auth: "Bearer " + n.token, body: body}); code != http.StatusOK {
		t.Fatalf("the node's own client: %d %s", code, msg)
	}
	if code, _ := n.do(t, req{method: "GET", path: "/v1/jobs", origin: "http://127.0.0.1:" + n.port}); code != http.StatusOK {
		t.Fatalf("same-origin dashboard read: %d", code)
	}
	if n.probes.Load() != 1 {
		t.Fatalf("probes run: %d, want 1", n.probes.Load())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	want := map[string]int{api.RefusedOrigin: 5, api.RefusedContentType: 2, api.RefusedToken: 3}
	got := map[string]int{}
	for _, r := range n.refused {
		got[r]++
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("refusals counted %v, want %v", got, want)
		}
	}
}

// A foreign Origin is refused on reads too: a page elsewhere learns
// nothing even if a browser would let it see the reply.
func TestAttackCrossSiteReadIsRefused(t *testing.T) {
	n := startNode(t)
	for _, p := range reads {
		for _, o := range []string{"http://attacker.example", "null", "http://localhost:" + n.port + ".attacker.example"} {
			if code, _ := n.do(t, req{method: "GET", path: p, origin: o}); code != http.StatusForbidden {
				t.Fatalf("GET %s from %s: %d", p, o, code)
			}
		}
		if code, _ := n.do(t, req{method: "GET", path: p, secFetch: "cross-site"}); code != http.StatusForbidden {
			t.Fatalf("GET %s cross-site: %d", p, code)
		}
	}
}

func TestAllowedHosts(t *testing.T) {
	n := startNode(t, api.WithAllowedHosts("node.lan"))
	if code, _ := n.do(t, req{method: "GET", path: "/v1/status", host: "node.lan:" + n.port}); code != http.StatusOK {
		t.Fatalf("allowed host: %d", code)
	}
	if code, _ := n.do(t, req{method: "GET", path: "/v1/status", host: "10.1.2.3:" + n.port}); code != http.StatusForbidden {
		t.Fatalf("an IP literal the server does not listen on: %d", code)
	}
}

func TestServerWithoutTokenRefusesChanges(t *testing.T) {
	srv := api.NewServer(func() api.Status { return api.Status{} }, slog.New(slog.DiscardHandler))
	ran := false
	srv.Handle("POST /v1/probe", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	err := api.Client{Addr: srv.Addr()}.PostJSON(context.Background(), "/v1/probe", map[string]string{}, &struct{}{})
	if err == nil || ran || !strings.Contains(err.Error(), "token") {
		t.Fatalf("tokenless server: %v, ran %v", err, ran)
	}
}

func TestClientSendsToken(t *testing.T) {
	n := startNode(t)
	c := api.Client{Addr: n.addr}
	if _, err := c.Probe(context.Background(), api.ProbeRequest{Peer: "p"}); err == nil || !strings.Contains(err.Error(), api.TokenFile) {
		t.Fatalf("without the token: %v", err)
	}
	c.Token = n.token
	if res, err := c.Probe(context.Background(), api.ProbeRequest{Peer: "p"}); err != nil || res.Peer != "p" {
		t.Fatalf("with the token: %+v %v", res, err)
	}
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestToken(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := api.ReadToken(dir); err == nil {
		t.Fatal("read a token that does not exist")
	}
	tok, err := api.LoadOrCreateToken(dir)
	if err != nil || len(tok) != 64 {
		t.Fatalf("%q %v", tok, err)
	}
	fi, err := os.Stat(filepath.Join(dir, api.TokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi.Mode(), err)
	}
	again, err := api.LoadOrCreateToken(dir)
	if err != nil || again != tok {
		t.Fatalf("second start: %q %v", again, err)
	}
	if read, err := api.ReadToken(dir); err != nil || read != tok {
		t.Fatalf("read: %q %v", read, err)
	}
	// A crash mid-write leaves a temporary file, never a torn token.
	if err := os.WriteFile(filepath.Join(dir, "."+api.TokenFile+".tmp-123"), []byte("12"), 0o600); err != nil {
		t.Fatal(err)
	}
	if read, err := api.ReadToken(dir); err != nil || read != tok {
		t.Fatalf("after a torn temp file: %q %v", read, err)
	}
	os.Chmod(filepath.Join(dir, api.TokenFile), 0o644)
	if _, err := api.ReadToken(dir); err == nil || !strings.Contains(err.Error(), "chmod") {
		t.Fatalf("world-readable token: %v", err)
	}
	os.WriteFile(filepath.Join(dir, api.TokenFile), []byte("short\n"), 0o600)
	os.Chmod(filepath.Join(dir, api.TokenFile), 0o600)
	if _, err := api.LoadOrCreateToken(dir); err == nil {
		t.Fatal("accepted a malformed token")
	}
}
