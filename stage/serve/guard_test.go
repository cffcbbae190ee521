package serve

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// do sends one request with the given headers and returns its status,
// body and headers.
func do(t *testing.T, method, url, body string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

const chatBody = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0}`

// TestDNSRebinding: a page on a name its attacker re-points at this
// machine sends that name as Host; the API refuses it and answers
// loopback names and the configured ones.
func TestDNSRebinding(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.AllowedHosts = []string{"gpu-box.lan"} })
	for _, host := range []string{"attacker.example", "attacker.example:8000", "127.0.0.1.attacker.example", "localhost.attacker.example", "10.0.0.5:8000"} {
		for _, path := range []string{"/v1/models", "/health"} {
			if code, body, _ := do(t, "GET", f.url+path, "", map[string]string{"Host": host}); code != 403 || !strings.Contains(body, "host_not_allowed") {
				t.Errorf("Host %s %s: %d %s", host, path, code, body)
			}
		}
		code, body, _ := do(t, "POST", f.url+"/v1/chat/completions", chatBody, map[string]string{"Host": host, "Content-Type": "application/json"})
		if code != 403 {
			t.Errorf("Host %s chat: %d %s", host, code, body)
		}
	}
	for _, host := range []string{"localhost:8000", "LOCALHOST", "127.0.0.1", "127.0.0.2:1", "[::1]:8000", "gpu-box.lan:8000", "gpu-box.lan."} {
		if code, body, _ := do(t, "GET", f.url+"/v1/models", "", map[string]string{"Host": host}); code != 200 {
			t.Errorf("Host %s: %d %s", host, code, body)
		}
	}
	// Listening on every address admits IP literals, which cannot be
	// re-pointed, and still no other name.
	g := newFixture(t, func(c *Config) { c.AllowedHosts = []string{"0.0.0.0"} })
	if code, _, _ := do(t, "GET", g.url+"/v1/models", "", map[string]string{"Host": "192.168.1.20:8000"}); code != 200 {
		t.Errorf("an IP literal on a server listening on 0.0.0.0: %d", code)
	}
	if code, _, _ := do(t, "GET", g.url+"/v1/models", "", map[string]string{"Host": "attacker.example"}); code != 403 {
		t.Errorf("a name on a server listening on 0.0.0.0: %d", code)
	}
}

// TestCrossSitePost: a web page's form or fetch without preflight can
// send text/plain (or form) bodies to any address; the API refuses every
// POST that is not application/json, and any request from a page whose
// origin it does not allow.
func TestCrossSitePost(t *testing.T) {
	f := newFixture(t, nil)
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx"} {
		code, body, _ := do(t, "POST", f.url+"/v1/completions", `{"prompt":"a","max_tokens":2}`, map[string]string{"Content-Type": ct})
		if code != 415 || !strings.Contains(body, "unsupported_media_type") {
			t.Errorf("Content-Type %q: %d %s", ct, code, body)
		}
	}
	if code, body, _ := do(t, "POST", f.url+"/v1/completions", `{"prompt":"a","max_tokens":2}`, map[string]string{"Content-Type": "application/json; charset=utf-8"}); code != 200 {
		t.Errorf("application/json with a charset: %d %s", code, body)
	}
	// The same attack from a browser carries an Origin: refused whatever
	// the type, and no CORS header lets the page read the answer.
	code, body, hdr := do(t, "POST", f.url+"/v1/chat/completions", chatBody, map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"})
	if code != 403 || !strings.Contains(body, "origin_not_allowed") || hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("a cross-site POST: %d %s %v", code, body, hdr)
	}
	code, _, hdr = do(t, "OPTIONS", f.url+"/v1/chat/completions", "", map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
	if code != 403 || hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("a preflight from a page not allowed: %d %v", code, hdr)
	}
}

func TestCORS(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CORSOrigins = []string{"https://chat.example"} })
	code, _, hdr := do(t, "OPTIONS", f.url+"/v1/chat/completions", "", map[string]string{
		"Origin": "https://chat.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
	if code != 204 || hdr.Get("Access-Control-Allow-Origin") != "https://chat.example" ||
		!strings.Contains(hdr.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(hdr.Get("Access-Control-Allow-Headers"), "x-stainless-os") {
		t.Fatalf("preflight: %d %v", code, hdr)
	}
	code, body, hdr := do(t, "POST", f.url+"/v1/chat/completions", chatBody, map[string]string{"Content-Type": "application/json", "Origin": "https://chat.example"})
	if code != 200 || hdr.Get("Access-Control-Allow-Origin") != "https://chat.example" || !strings.Contains(hdr.Get("Vary"), "Origin") {
		t.Fatalf("allowed origin: %d %s %v", code, body, hdr)
	}
	if code, _, _ := do(t, "GET", f.url+"/v1/models", "", map[string]string{"Origin": "https://chat.example.evil"}); code != 403 {
		t.Fatalf("another origin: %d", code)
	}
	g := newFixture(t, func(c *Config) { c.CORSOrigins = []string{"*"} })
	if code, _, hdr := do(t, "GET", g.url+"/v1/models", "", map[string]string{"Origin": "https://any.example"}); code != 200 || hdr.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("origin *: %d %v", code, hdr)
	}
}

// TestAPIKey: with a key set, requests without it or with another are
// refused with OpenAI's 401, on every endpoint but /health.
func TestAPIKey(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.APIKey = "sk-holo-secret" })
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer sk-holo-secreT", "Bearer sk-holo-secret2", "Basic c2staG9sby1zZWNyZXQ=", "sk-holo-secret"} {
		for _, req := range []struct{ method, path, body string }{{"GET", "/v1/models", ""}, {"GET", "/v1/models/tiny", ""}, {"POST", "/v1/chat/completions", chatBody}} {
			code, body, hdr := do(t, req.method, f.url+req.path, req.body, map[string]string{"Authorization": auth, "Content-Type": "application/json"})
			if code != 401 || !strings.Contains(body, "api_key") || hdr.Get("WWW-Authenticate") == "" {
				t.Errorf("Authorization %q %s: %d %s", auth, req.path, code, body)
			}
		}
	}
	if code, body, _ := do(t, "POST", f.url+"/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer sk-holo-secret", "Content-Type": "application/json"}); code != 200 {
		t.Fatalf("the right key: %d %s", code, body)
	}
	if code, _, _ := do(t, "GET", f.url+"/health", "", nil); code != 200 {
		t.Fatalf("/health without a key: %d", code)
	}
}
