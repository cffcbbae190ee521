package main

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// Against a running `holopeer up`: a rebinding page and a cross-site
// text/plain POST get nothing, the refusals show in /metrics, and the CLI
// gets through to /v1/probe only with the token from the data dir.
func TestControlAPIRefusesWebPages(t *testing.T) {
	dir := t.TempDir()
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startProc(t, "up", "--data-dir", dir, "--swarm", "guard",
		"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", freePort(t)), "--api", apiAddr)
	addr := waitAddr(t, p)
	self := addr[strings.LastIndex(addr, "/")+1:]
	do := func(method, path, host, origin, ctype string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+apiAddr+path, strings.NewReader(`{"peer":"`+self+`","bytes":67108864}`))
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/v1/status", "/v1/jobs", "/metrics", "/v1/ledger/top"} {
		if code, body := do("GET", path, "rebind.attacker.example:7601", "", ""); code != http.StatusForbidden || strings.Contains(body, self) {
			t.Fatalf("rebinding read of %s: %d %.200s", path, code, body)
		}
	}
	if code, _ := do("POST", "/v1/probe", "", "http://attacker.example", "text/plain"); code != http.StatusForbidden {
		t.Fatalf("cross-site text/plain probe: %d", code)
	}
	if code, _ := do("POST", "/v1/probe", "", "", "application/json"); code != http.StatusUnauthorized {
		t.Fatalf("probe without the token: %d", code)
	}
	_, metrics := do("GET", "/metrics", "", "", "")
	for _, want := range []string{`holopeer_refused_total{protocol="control-api",reason="host"} 4`, `holopeer_refused_total{protocol="control-api",reason="origin"} 1`, `holopeer_refused_total{protocol="control-api",reason="token"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}

	out, err := exec.Command(binPath, "probe", "--api", apiAddr, "--data-dir", t.TempDir(), "--peer", self).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "api.token") {
		t.Fatalf("probe with no token file: %v %s", err, out)
	}
	// With the token the request passes the guard: what fails now is the
	// probe itself (a node cannot probe itself), not the API's checks.
	out, _ = exec.Command(binPath, "probe", "--api", apiAddr, "--data-dir", dir, "--peer", self, "--bytes", "1KiB", "--timeout", "2s").CombinedOutput()
	t.Logf("self-probe: %s", out)
	if s := string(out); strings.Contains(s, "token") || strings.Contains(s, "Content-Type") || strings.Contains(s, "Host") {
		t.Fatalf("the CLI was refused by the guard: %s", s)
	}
}
