package dashboard

import (
	"bytes"
	"net/http"
	"strconv"
	"time"
)

// Limits of one event stream: it ends after maxStreamAge (the browser
// reconnects by itself), and a write that cannot finish in writeTimeout
// ends it too, so a stalled viewer holds nothing for long.
const (
	maxStreamAge   = 5 * time.Minute
	writeTimeout   = 10 * time.Second
	keepaliveEvery = 15 * time.Second
	retryMillis    = 2000
)

// serveEvents pushes the state as server-sent events whenever it changes.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	select {
	case d.streams <- struct{}{}:
	default:
		// The page falls back to polling state.json.
		http.Error(w, "dashboard: too many live viewers; polling instead", http.StatusServiceUnavailable)
		return
	}
	d.wg.Add(1)
	defer func() {
		<-d.streams
		d.wg.Done()
	}()
	select {
	case <-d.done:
		http.Error(w, "dashboard: closing", http.StatusServiceUnavailable)
		return
	default:
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	var last []byte
	lastWrite := time.Now()
	send := func(chunks ...[]byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		for _, c := range chunks {
			if _, err := w.Write(c); err != nil {
				return false
			}
		}
		lastWrite = time.Now()
		return rc.Flush() == nil
	}
	if !send([]byte("retry: " + strconv.Itoa(retryMillis) + "\n\n")) {
		return
	}
	tick := time.NewTicker(d.interval)
	defer tick.Stop()
	age := time.NewTimer(maxStreamAge)
	defer age.Stop()
	for {
		_, b := d.state()
		switch {
		case !bytes.Equal(b, last):
			if !send([]byte("event: state\ndata: "), b, []byte("\n\n")) {
				return
			}
			last = b
		case time.Since(lastWrite) > keepaliveEvery:
			if !send([]byte(": keepalive\n\n")) {
				return
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-d.done:
			return
		case <-age.C:
			return
		case <-tick.C:
		}
	}
}
