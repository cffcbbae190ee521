package ledger

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/holopeer/holopeer/peer/api"
)

// API paths a node serves its ledger on (mount Handler at "GET /v1/ledger/").
const (
	PathReceipts = "/v1/ledger/receipts" // JSON lines, one receipt each
	PathTerms    = "/v1/ledger/terms"    // JSON lines, one term record each
	PathTop      = "/v1/ledger/top"      // the node's own verified Report; ?n= keeps the top n totals
)

// Handler serves the ledger's raw receipts and terms, so anyone can redo
// the arithmetic (`holopeer ledger verify --api`), and the node's own
// verified totals.
func (l *Ledger) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathReceipts, func(w http.ResponseWriter, r *http.Request) {
		writeLines(w, l.store.Receipts())
	})
	mux.HandleFunc("GET "+PathTerms, func(w http.ResponseWriter, r *http.Request) {
		writeLines(w, l.hist.Records())
	})
	mux.HandleFunc("GET "+PathTop, func(w http.ResponseWriter, r *http.Request) {
		rep := l.Report()
		if s := r.URL.Query().Get("n"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				api.WriteJSON(w, http.StatusBadRequest, api.ErrorReply{Error: fmt.Sprintf("ledger top: n=%q is not a count", s)})
				return
			}
			rep.Totals = rep.Top(n)
		}
		api.WriteJSON(w, http.StatusOK, rep)
	})
	return mux
}

func writeLines[T any](w http.ResponseWriter, items []T) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	bw := bufio.NewWriter(w)
	for _, it := range items {
		line, err := encodeLine(it)
		if err != nil {
			continue
		}
		if _, err := bw.Write(line); err != nil {
			return
		}
	}
	bw.Flush()
}

// Fetch reads a node's receipts and term history from its control API at
// addr (HOST:PORT), bounded as the files are, for verifying elsewhere.
func Fetch(ctx context.Context, addr, swarm string, maxReceipts int) ([]Receipt, *History, error) {
	hc := &http.Client{}
	get := func(path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("cannot reach the node's control API at %s (is `holopeer up` running with --api %s?): %w", addr, addr, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("control API %s: %s (does this node serve its ledger?)", path, resp.Status)
		}
		return resp, nil
	}
	resp, err := get(PathTerms)
	if err != nil {
		return nil, nil, err
	}
	hist, err := ReadHistory(resp.Body, swarm)
	resp.Body.Close()
	if err != nil {
		return nil, nil, err
	}
	if resp, err = get(PathReceipts); err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	rs, _, err := ReadReceipts(resp.Body, maxReceipts)
	if err != nil {
		return nil, nil, err
	}
	return rs, hist, nil
}

// CheckIncoming is what a gossip validator asks of a receipt message
// published by author: it parses, belongs to swarm, was published by the
// coordinator that signed it, carries a good signature, and (when terms
// knows the term) was signed by that term's coordinator. Receipts of a
// term terms does not know yet pass: Verify judges them later.
func CheckIncoming(b []byte, swarm, author string, terms TermHistory) (Receipt, error) {
	r, err := DecodeReceipt(b)
	if err != nil {
		return Receipt{}, err
	}
	if r.Swarm != swarm {
		return Receipt{}, fmt.Errorf("%w: %q", ErrOtherSwarm, r.Swarm)
	}
	if author != r.Coordinator {
		return Receipt{}, fmt.Errorf("%w: published by %s, signed as %s", ErrNotCoordinator, author, r.Coordinator)
	}
	if err := r.CheckSignature(); err != nil {
		return Receipt{}, err
	}
	if terms != nil {
		if c, ok := terms.CoordinatorOf(r.Term); ok && c != r.Coordinator {
			return Receipt{}, fmt.Errorf("%w: term %d was %s's", ErrNotCoordinator, r.Term, c)
		}
	}
	return r, nil
}
