package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/ledger"
)

// Refusals by the control API and the ledger, fed through their hooks as
// a node wires them, show in /metrics by protocol and reason.
func TestRefusalsShowInMetrics(t *testing.T) {
	m := New(WithoutRuntime())
	srv := api.NewServer(func() api.Status { return api.Status{} }, slog.New(slog.DiscardHandler),
		api.WithToken(strings.Repeat("ab", 32)), api.WithRefusals(func(r string) { m.Refused("control-api", r) }))
	srv.Handle("GET /metrics", m.Handler())
	srv.Handle("POST /v1/probe", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("probe ran") }))
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	send := func(method, path, host, ctype string) {
		r, _ := http.NewRequest(method, "http://"+srv.Addr()+path, strings.NewReader("{}"))
		r.Host = host
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send("GET", "/v1/status", "attacker.example", "")
	send("GET", "/v1/status", "attacker.example", "")
	send("POST", "/v1/probe", srv.Addr(), "text/plain")
	send("POST", "/v1/probe", srv.Addr(), "application/json")

	l, err := ledger.Open(t.TempDir(), "lab", ledger.WithRefusals(func(r string) { m.Refused("ledger", r) }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := peer.IDFromPrivateKey(key)
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	r, err := ledger.Sign(ledger.Receipt{Swarm: "lab", Term: 9, Peer: id.String(), PeriodStart: at, PeriodEnd: at.Add(time.Minute), PresenceS: 60, IssuedAt: at.Add(time.Minute)}, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RecordTerm(ledger.TermRecord{Term: 1, Coordinator: id.String(), AcceptedAt: at}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Add(r); !errors.Is(err, ledger.ErrUnknownTerm) {
		t.Fatalf("receipt of an unknown term: %v", err)
	}

	// Scraped through the same guarded server, as Prometheus on the node
	// would.
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`holopeer_refused_total{protocol="control-api",reason="host"} 2`,
		`holopeer_refused_total{protocol="control-api",reason="content_type"} 1`,
		`holopeer_refused_total{protocol="control-api",reason="token"} 1`,
		`holopeer_refused_total{protocol="ledger",reason="unknown_term"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, b)
		}
	}
	var nilM *Metrics
	nilM.Refused("x", "y") // callers without metrics need not check
}
