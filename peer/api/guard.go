package api

import (
	"crypto/subtle"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Why the control API refused a request: the reason label of the
// refusal metric (see WithRefusals).
const (
	RefusedHost        = "host"         // Host not on the allowlist (DNS rebinding)
	RefusedOrigin      = "origin"       // a browser request from another web origin
	RefusedContentType = "content_type" // a POST not sent as application/json
	RefusedToken       = "token"        // a state-changing request without the node's token
)

// maxBody bounds a request body: every control request is a small JSON
// object.
const maxBody = 1 << 20

// safeMethod reports whether a method only reads: these need no token.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// guard puts the checks every request passes before a route sees it, in
// this order:
//
//   - Host: a loopback name, the host the server listens on, or one given
//     with WithAllowedHosts. A page on attacker.example whose name is
//     re-pointed at 127.0.0.1 (DNS rebinding) sends its own name as Host,
//     so without this check it could read the API as its own origin.
//   - Origin and Sec-Fetch-Site: a browser request from any other web
//     origin is refused, reads included; only the dashboard, served by
//     this server, is same-origin.
//   - Content-Type: application/json on every request that is not a read,
//     so a page cannot send a "simple" text/plain or form POST, which
//     needs no CORS preflight.
//   - Authorization: Bearer <the node's token> on every request that is
//     not a read. The token is a file in the data dir (LoadOrCreateToken)
//     that only the node's user can read, and the CLI sends it.
func (s *Server) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hostAllowed(r.Host) {
			s.refuse(w, RefusedHost, http.StatusForbidden,
				fmt.Sprintf("control API: Host %q is not one this node answers to (use 127.0.0.1 or localhost)", clipHeader(r.Host)))
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
			s.refuse(w, RefusedOrigin, http.StatusForbidden,
				fmt.Sprintf("control API: requests from the web origin %q are not allowed", clipHeader(origin)))
			return
		}
		if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
			s.refuse(w, RefusedOrigin, http.StatusForbidden, "control API: cross-site requests are not allowed")
			return
		}
		if !safeMethod(r.Method) {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mt != "application/json" {
				s.refuse(w, RefusedContentType, http.StatusUnsupportedMediaType,
					fmt.Sprintf("control API: Content-Type %q: send the body as application/json", clipHeader(r.Header.Get("Content-Type"))))
				return
			}
			if !s.tokenOK(r.Header.Get("Authorization")) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="holopeer"`)
				s.refuse(w, RefusedToken, http.StatusUnauthorized,
					"control API: this request needs the node's API token (Authorization: Bearer, from "+TokenFile+" in the node's data dir)")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) refuse(w http.ResponseWriter, reason string, code int, msg string) {
	if s.refusals != nil {
		s.refusals(reason)
	}
	WriteJSON(w, code, ErrorReply{Error: msg})
}

// tokenOK compares a bearer token with the node's in constant time. A
// server without a token refuses every state-changing request.
func (s *Server) tokenOK(auth string) bool {
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || s.token == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(s.token)) == 1
}

// normalHost is a Host header's or an address's host part, lower case,
// without port, brackets or a trailing dot.
func normalHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

func (s *Server) hostAllowed(host string) bool {
	h := normalHost(host)
	if h == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h == "localhost" || s.hosts[h] {
		return true
	}
	if ip := net.ParseIP(h); ip != nil {
		// An IP literal cannot be re-pointed by DNS, so any is safe where
		// the server listens on every address.
		return ip.IsLoopback() || s.anyIP
	}
	return false
}

// sameOrigin reports whether a browser's Origin is this server itself
// (the dashboard): http(s) and exactly the request's Host.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" || u.User != nil {
		return false
	}
	return strings.EqualFold(u.Host, host)
}

// clipHeader keeps a hostile header short and printable in an error.
func clipHeader(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
