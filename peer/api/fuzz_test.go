package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzGuard sends arbitrary requests through the guard to a status route
// and a probe route. A request reaches the probe only with an allowed
// Host, no foreign origin, a JSON content type and the token; nothing
// panics, and every refusal is counted once.
func FuzzGuard(f *testing.F) {
	const tok = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	f.Add("POST", "/v1/probe", "127.0.0.1:7601", "", "application/json", "Bearer "+tok, "", `{"peer":"p"}`)
	f.Add("POST", "/v1/probe", "127.0.0.1:7601", "http://attacker.example", "text/plain", "", "", `{"peer":"p"}`)
	f.Add("GET", "/v1/status", "attacker.example:7601", "", "", "", "", "")
	f.Add("GET", "/v1/status", "[::1]:7601", "http://[::1]:7601", "", "", "same-origin", "")
	f.Add("PUT", "/v1/probe", "localhost", "null", "application/json;x=\"", "bearer  "+tok, "cross-site", "{")
	f.Fuzz(func(t *testing.T, method, path, host, origin, ctype, auth, secFetch, body string) {
		refusals := 0
		s := NewServer(func() Status { return Status{PeerID: "p"} }, slog.New(slog.DiscardHandler),
			WithToken(tok), WithRefusals(func(string) { refusals++ }))
		probed := false
		s.Handle("POST /v1/probe", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			probed = true
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				WriteJSON(w, http.StatusRequestEntityTooLarge, ErrorReply{Error: err.Error()})
				return
			}
			WriteJSON(w, http.StatusOK, ProbeResult{})
		}))
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		r, err := http.NewRequest("GET", "http://127.0.0.1:7601/", strings.NewReader(body))
		if err != nil {
			t.Skip()
		}
		r.Method, r.URL.Path, r.Host = method, path, host
		for k, v := range map[string]string{"Origin": origin, "Content-Type": ctype, "Authorization": auth, "Sec-Fetch-Site": secFetch} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if probed {
			if !s.hostAllowed(host) || (origin != "" && !sameOrigin(origin, host)) || secFetch == "cross-site" || !s.tokenOK(auth) {
				t.Fatalf("probe ran for Host %q Origin %q auth %q", host, origin, auth)
			}
			if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ctype)), "application/json") {
				t.Fatalf("probe ran with Content-Type %q", ctype)
			}
		}
		if w.Code == http.StatusForbidden || w.Code == http.StatusUnauthorized || w.Code == http.StatusUnsupportedMediaType {
			if refusals != 1 {
				t.Fatalf("%d refusals counted for a %d", refusals, w.Code)
			}
		} else if refusals != 0 {
			t.Fatalf("%d refusals counted for a %d", refusals, w.Code)
		}
	})
}
