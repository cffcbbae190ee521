package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// usage counts a request's tokens.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int        `json:"index"`
	Message      *chatReply `json:"message,omitempty"`
	Delta        *chatDelta `json:"delta,omitempty"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type chatReply struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// response is a completion, a chat completion or one chunk of either.
type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// pieces carries text from the engine's goroutine to the handler's
// without ever blocking the engine (a slow client must not stall the
// batch other requests share).
type pieces struct {
	mu   sync.Mutex
	buf  []string
	wake chan struct{}
}

func (p *pieces) push(s string) {
	p.mu.Lock()
	p.buf = append(p.buf, s)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pieces) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.buf
	p.buf = nil
	return out
}

// run generates for a checked request and writes the answer: one JSON
// body, or a stream of server-sent events.
func (s *Server) run(w http.ResponseWriter, r *http.Request, g generation, id string) {
	ctx := r.Context()
	start := time.Now()
	if s.pending.Add(1) > int64(s.cfg.MaxBatch+s.cfg.MaxQueue) {
		s.pending.Add(-1)
		writeError(w, &apiError{status: http.StatusTooManyRequests, Type: "rate_limit_error", CodeStr: "queue_full",
			Message: fmt.Sprintf("the server is busy: %d requests are generating and %d waiting; retry shortly", s.cfg.MaxBatch, s.cfg.MaxQueue)})
		return
	}
	defer s.pending.Add(-1)
	created := s.cfg.Now().Unix()
	var stream *sse
	if g.stream {
		// Headers go out while the request waits for a slot, so that a
		// client sees the stream open at once.
		var err error
		if stream, err = newSSE(w); err != nil {
			writeError(w, &apiError{status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()})
			return
		}
	}
	var quiet <-chan time.Time
	if g.stream {
		t := time.NewTicker(s.cfg.StreamKeepAlive)
		defer t.Stop()
		quiet = t.C
	}
	for waiting := true; waiting; {
		select {
		case s.slots <- struct{}{}:
			waiting = false
		case <-quiet:
			if stream.comment() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
	defer func() { <-s.slots }()

	tracker := newTextTracker(s.cfg.Tokenizer, s.eos, g.stops)
	sampler := NewSampler(g.sampling)
	out := &pieces{wake: make(chan struct{}, 1)}
	produced := 0
	var first time.Time
	emit := func(tok int32) bool {
		produced++
		if produced == 1 {
			first = time.Now()
		}
		delta, stop := tracker.add(int(tok))
		if delta != "" && g.stream {
			out.push(delta)
		}
		return stop
	}
	genDone := make(chan error, 1)
	go func() { genDone <- s.cfg.Engine.Generate(ctx, g.prompt, g.maxNew, sampler.Pick, emit) }()

	if g.stream && g.chat {
		role := ""
		_ = stream.send(s.chatChunk(id, created, &chatDelta{Role: "assistant", Content: &role}, nil))
	}
	var err error
	for waiting := true; waiting; {
		select {
		case err = <-genDone:
			waiting = false
		case <-out.wake:
		case <-quiet:
			if stream.idle(s.cfg.StreamKeepAlive) {
				_ = stream.comment()
			}
		}
		if g.stream {
			for _, p := range out.take() {
				if werr := stream.send(s.textChunk(g.chat, id, created, p, nil)); werr != nil {
					// The client is gone; the request's context ends the
					// generation.
					<-genDone
					s.logDone(g, id, start, first, produced, werr)
					return
				}
			}
		}
	}
	if ctx.Err() != nil {
		s.logDone(g, id, start, first, produced, ctx.Err())
		return // the client went away
	}
	if err != nil {
		s.logDone(g, id, start, first, produced, err)
		e := &apiError{status: http.StatusInternalServerError, Type: "server_error", CodeStr: "generation_failed", Message: "generation failed: " + err.Error()}
		if g.stream {
			_ = stream.send(map[string]*apiError{"error": e})
			_ = stream.done()
			return
		}
		writeError(w, e)
		return
	}
	tail := tracker.flush()
	finish := "length"
	if tracker.stopped {
		finish = "stop"
	}
	u := &usage{PromptTokens: len(g.prompt), CompletionTokens: produced, TotalTokens: len(g.prompt) + produced}
	s.logDone(g, id, start, first, produced, nil)
	if !g.stream {
		writeJSON(w, http.StatusOK, s.final(g.chat, id, created, tracker.text(), finish, u))
		return
	}
	if tail != "" {
		_ = stream.send(s.textChunk(g.chat, id, created, tail, nil))
	}
	if g.chat {
		_ = stream.send(s.chatChunk(id, created, &chatDelta{}, &finish))
	} else {
		_ = stream.send(s.textChunk(false, id, created, "", &finish))
	}
	if g.includeUsage {
		_ = stream.send(response{ID: id, Object: objectName(g.chat, true), Created: created, Model: s.cfg.Model, Choices: []any{}, Usage: u})
	}
	_ = stream.done()
}

func objectName(chat, chunk bool) string {
	switch {
	case chat && chunk:
		return "chat.completion.chunk"
	case chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (s *Server) textChunk(chat bool, id string, created int64, text string, finish *string) response {
	if chat {
		return s.chatChunk(id, created, &chatDelta{Content: &text}, finish)
	}
	return response{ID: id, Object: objectName(false, true), Created: created, Model: s.cfg.Model,
		Choices: []completionChoice{{Text: text, FinishReason: finish}}}
}

func (s *Server) chatChunk(id string, created int64, d *chatDelta, finish *string) response {
	return response{ID: id, Object: objectName(true, true), Created: created, Model: s.cfg.Model,
		Choices: []chatChoice{{Delta: d, FinishReason: finish}}}
}

func (s *Server) final(chat bool, id string, created int64, text, finish string, u *usage) response {
	r := response{ID: id, Object: objectName(chat, false), Created: created, Model: s.cfg.Model, Usage: u}
	if chat {
		r.Choices = []chatChoice{{Message: &chatReply{Role: "assistant", Content: text}, FinishReason: &finish}}
	} else {
		r.Choices = []completionChoice{{Text: text, FinishReason: &finish}}
	}
	return r
}

func (s *Server) logDone(g generation, id string, start, first time.Time, produced int, err error) {
	attrs := []any{"id", id, "chat", g.chat, "stream", g.stream, "prompt_tokens", len(g.prompt), "tokens", produced,
		"took", time.Since(start).Round(time.Millisecond)}
	if !first.IsZero() {
		attrs = append(attrs, "first_token", first.Sub(start).Round(time.Millisecond))
	}
	switch {
	case err == nil:
		s.log.Info("request done", attrs...)
	case errors.Is(err, context.Canceled):
		s.log.Info("request abandoned by the client", attrs...)
	default:
		s.log.Warn("request failed", append(attrs, "err", err)...)
	}
}

// sse writes server-sent events.
type sse struct {
	w    http.ResponseWriter
	f    http.Flusher
	last time.Time // of the last write
}

func newSSE(w http.ResponseWriter) (*sse, error) {
	f, ok := w.(http.Flusher)
	if !ok {
		return nil, errors.New("serve: the connection cannot stream")
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sse{w: w, f: f, last: time.Now()}, nil
}

// idle says nothing was written for at least d.
func (e *sse) idle(d time.Duration) bool { return time.Since(e.last) >= d }

// comment writes an SSE comment line, which clients ignore: it keeps a
// silent stream open.
func (e *sse) comment() error {
	if _, err := fmt.Fprint(e.w, ": keep-alive\n\n"); err != nil {
		return err
	}
	e.f.Flush()
	e.last = time.Now()
	return nil
}

func (e *sse) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "data: %s\n\n", b); err != nil {
		return err
	}
	e.f.Flush()
	e.last = time.Now()
	return nil
}

func (e *sse) done() error {
	if _, err := fmt.Fprint(e.w, "data: [DONE]\n\n"); err != nil {
		return err
	}
	e.f.Flush()
	return nil
}
