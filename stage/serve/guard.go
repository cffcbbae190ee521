package serve

import (
	"crypto/subtle"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strings"
)

// guard puts the checks every request passes before the API sees it, in
// this order:
//
//   - Host: a loopback name or one of Config.AllowedHosts, against DNS
//     rebinding (a page on attacker.example re-pointed at 127.0.0.1
//     would otherwise read the API as its own origin);
//   - Origin: a browser's cross-site request is answered only for
//     Config.CORSOrigins, whose preflights (OPTIONS) are answered here;
//   - the API key, when Config.APIKey is set;
//   - Content-Type: application/json on every POST, so that a page
//     cannot send a "simple" cross-site text/plain or form POST that
//     needs no preflight.
func (s *Server) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hostAllowed(r.Host) {
			s.writeError(w, &apiError{status: http.StatusForbidden, Type: "invalid_request_error", CodeStr: "host_not_allowed",
				Message: fmt.Sprintf("Host %q is not one this server answers to; start it with --allow-host %s to admit it", r.Host, normalHost(r.Host))})
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" {
			if !s.originAllowed(origin) {
				s.writeError(w, &apiError{status: http.StatusForbidden, Type: "invalid_request_error", CodeStr: "origin_not_allowed",
					Message: fmt.Sprintf("requests from the web origin %q are not allowed; start the server with --cors-origin %s to allow them", origin, origin)})
				return
			}
			hd := w.Header()
			hd.Add("Vary", "Origin")
			if s.origins["*"] {
				hd.Set("Access-Control-Allow-Origin", "*")
			} else {
				hd.Set("Access-Control-Allow-Origin", origin)
			}
			if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
				hd.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
				// The official SDKs send headers of their own (x-stainless-…):
				// admit those asked for, as a preflight names them.
				allow := "Authorization, Content-Type"
				if asked := r.Header.Get("Access-Control-Request-Headers"); asked != "" {
					allow = asked
				}
				hd.Set("Access-Control-Allow-Headers", allow)
				hd.Set("Access-Control-Max-Age", "600")
				hd.Add("Vary", "Access-Control-Request-Method")
				hd.Add("Vary", "Access-Control-Request-Headers")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		if s.cfg.APIKey != "" && r.URL.Path != "/health" {
			if e := s.checkKey(r.Header.Get("Authorization")); e != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="holopeer"`)
				s.writeError(w, e)
				return
			}
		}
		if r.Method == http.MethodPost {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mt != "application/json" {
				s.writeError(w, &apiError{status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", CodeStr: "unsupported_media_type",
					Message: fmt.Sprintf("Content-Type %q: send the body as application/json", r.Header.Get("Content-Type"))})
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// checkKey compares a bearer token with the API key in constant time.
func (s *Server) checkKey(auth string) *apiError {
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return &apiError{status: http.StatusUnauthorized, Type: "invalid_request_error", CodeStr: "missing_api_key",
			Message: "You didn't provide an API key. Send it in an Authorization header as 'Authorization: Bearer YOUR_KEY'."}
	}
	if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.cfg.APIKey)) != 1 {
		return &apiError{status: http.StatusUnauthorized, Type: "invalid_request_error", CodeStr: "invalid_api_key",
			Message: "Incorrect API key provided."}
	}
	return nil
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
		return false // HTTP/1.1 requires a Host; Go fills it in for HTTP/1.0
	}
	if h == "localhost" || s.hosts[h] {
		return true
	}
	if ip := net.ParseIP(h); ip != nil {
		// An IP literal cannot be re-pointed, so it is safe where the
		// server listens on every address.
		return ip.IsLoopback() || s.anyIP
	}
	return false
}

func (s *Server) originAllowed(origin string) bool {
	return s.origins["*"] || s.origins[strings.TrimSuffix(origin, "/")]
}
