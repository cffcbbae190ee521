package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
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
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// completionLogprobs is a completion choice's logprobs, OpenAI's legacy
// shape: parallel arrays, one entry per output token. text_offset is
// where each token begins in the choice's text, in bytes.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatReply    `json:"message,omitempty"`
	Delta        *chatDelta    `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// chatLogprobs is a chat choice's logprobs: one entry per output token.
type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
	Refusal []chatTokenLogprob `json:"refusal"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatReply struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
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

// tokenLogprob is one output token's logprob and its alternatives.
type tokenLogprob struct {
	id     int32
	offset int // where its text begins in the choice's text
	lp     float64
	top    []TokenLogprob
}

// piece is text (and the logprobs of the tokens it begins) for one
// choice, on its way from the engine's goroutine to the handler's.
type piece struct {
	index int
	text  string
	lps   []tokenLogprob
}

// pieces carries text from the engine's goroutine to the handler's
// without ever blocking the engine (a slow client must not stall the
// batch other requests share).
type pieces struct {
	mu   sync.Mutex
	buf  []piece
	wake chan struct{}
}

func (p *pieces) push(s piece) {
	p.mu.Lock()
	p.buf = append(p.buf, s)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pieces) take() []piece {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.buf
	p.buf = nil
	return out
}

// choice is one generated sequence of a request. Its fields are written
// on the engine's goroutine until its generation returns.
type choice struct {
	index    int
	tracker  *textTracker
	sampler  *Sampler
	produced int
	pending  tokenLogprob   // the logprob of the token just picked
	lps      []tokenLogprob // one per token the tracker holds
	streamed int            // lps already sent
	total    float64        // sum of the picked tokens' logprobs (best_of)
	begun    time.Time      // when its generation started
	last     time.Time      // when it emitted its last token
	err      error
	finish   string
	tail     string // the text held back until the end
}

// run generates for a checked request and writes the answer: one JSON
// body, or a stream of server-sent events.
func (s *Server) run(w http.ResponseWriter, r *http.Request, g generation, id string) {
	start := time.Now()
	n := g.choices()
	if s.pending.Add(int64(n)) > int64(s.cfg.MaxBatch+s.cfg.MaxQueue) {
		s.pending.Add(-int64(n))
		s.writeError(w, &apiError{status: http.StatusTooManyRequests, Type: "rate_limit_error", CodeStr: "queue_full",
			Message: fmt.Sprintf("the server is busy: %d sequences are generating and %d waiting; retry shortly", s.cfg.MaxBatch, s.cfg.MaxQueue)})
		return
	}
	defer s.pending.Add(-int64(n))
	created := s.cfg.Now().Unix()
	var stream *sse
	if g.stream {
		// Headers go out while the request waits for a slot, so that a
		// client sees the stream open at once.
		var err error
		if stream, err = newSSE(w); err != nil {
			s.writeError(w, &apiError{status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()})
			return
		}
	}
	var quiet <-chan time.Time
	if g.stream {
		t := time.NewTicker(s.cfg.StreamKeepAlive)
		defer t.Stop()
		quiet = t.C
	}
	held, ok := s.acquire(r.Context(), n, quiet, stream)
	defer func() {
		for range held {
			<-s.slots
		}
	}()
	if !ok {
		return
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	out := &pieces{wake: make(chan struct{}, 1)}
	scored := g.logprobs || g.bestOf > g.n
	choices := make([]*choice, n)
	done := make(chan *choice, n)
	for i := range choices {
		sm := g.sampling
		sm.Stream = uint64(i)
		c := &choice{index: i, tracker: newTextTracker(s.cfg.Tokenizer, s.eos, g.stops), sampler: NewSampler(sm)}
		choices[i] = c
		pick := func(logits []float32) int32 {
			tok := c.sampler.Pick(logits)
			if scored {
				lp, top := c.sampler.Logprobs(tok, g.topLogprobs)
				c.pending = tokenLogprob{id: tok, lp: finite(lp), top: slices.Clone(top)}
				c.total += c.pending.lp
			}
			return tok
		}
		emit := func(tok int32) bool {
			now := time.Now()
			if c.produced == 0 {
				s.metrics.ttft.Observe(now.Sub(start).Seconds())
			} else {
				s.metrics.interToken.Observe(now.Sub(c.last).Seconds())
			}
			c.last = now
			c.produced++
			held := len(c.tracker.ids)
			delta, stop := c.tracker.add(int(tok))
			if g.logprobs && len(c.tracker.ids) > held {
				c.pending.offset = c.tracker.starts[len(c.tracker.starts)-1]
				c.lps = append(c.lps, c.pending)
			}
			if g.stream {
				p := piece{index: c.index, text: delta}
				if g.logprobs {
					k := c.tracker.covered()
					p.lps, c.streamed = c.lps[c.streamed:k], k
				}
				if p.text != "" || len(p.lps) > 0 {
					out.push(p)
				}
			}
			return stop
		}
		go func() {
			c.begun = time.Now()
			c.err = s.cfg.Engine.Generate(ctx, g.prompt, g.maxNew, pick, emit)
			done <- c
		}()
	}

	if g.stream {
		for _, c := range choices {
			var err error
			if g.chat {
				role := ""
				err = stream.send(s.chatChunk(id, created, c.index, &chatDelta{Role: "assistant", Content: &role}, nil, nil))
			} else if g.echo != "" {
				err = stream.send(s.textChunk(false, id, created, piece{index: c.index, text: g.echo}, nil, g))
			}
			if err != nil {
				break
			}
		}
	}
	var failed *choice
	var gone error // the client went away mid-stream
	for left := n; left > 0; {
		var finished *choice
		select {
		case finished = <-done:
			left--
		case <-out.wake:
		case <-quiet:
			if stream.idle(s.cfg.StreamKeepAlive) {
				_ = stream.comment()
			}
		}
		if g.stream && gone == nil {
			for _, p := range out.take() {
				if gone = stream.send(s.textChunk(g.chat, id, created, p, nil, g)); gone != nil {
					// The client is gone; ending the context ends the
					// generations.
					cancel()
					break
				}
			}
		}
		if finished == nil {
			continue
		}
		s.finishChoice(finished, g)
		if finished.err != nil && failed == nil && r.Context().Err() == nil {
			failed = finished
			cancel() // the answer is an error now: stop the others
		}
		if g.stream && gone == nil && failed == nil {
			gone = s.streamEnd(stream, id, created, finished, g)
		}
	}
	for _, c := range choices {
		s.metrics.observeChoice(c)
	}
	produced := 0
	for _, c := range choices {
		produced += c.produced
	}
	switch {
	case r.Context().Err() != nil:
		s.logDone(g, id, start, produced, r.Context().Err())
		return
	case gone != nil:
		s.logDone(g, id, start, produced, gone)
		return
	case failed != nil:
		s.logDone(g, id, start, produced, failed.err)
		e := &apiError{status: http.StatusInternalServerError, Type: "server_error", CodeStr: "generation_failed", Message: "generation failed: " + failed.err.Error()}
		if g.stream {
			s.metrics.errors.WithLabelValues(e.CodeStr).Inc()
			_ = stream.send(map[string]*apiError{"error": e})
			_ = stream.done()
			return
		}
		s.writeError(w, e)
		return
	}
	u := &usage{PromptTokens: len(g.prompt), CompletionTokens: produced, TotalTokens: len(g.prompt) + produced}
	s.metrics.tokens.WithLabelValues("prompt").Add(float64(len(g.prompt)))
	s.metrics.tokens.WithLabelValues("completion").Add(float64(produced))
	s.logDone(g, id, start, produced, nil)
	if !g.stream {
		if g.bestOf > g.n {
			// The n most likely of those generated, as OpenAI ranks them.
			slices.SortStableFunc(choices, func(a, b *choice) int { return cmp.Compare(b.total, a.total) })
			choices = choices[:g.n]
			for i, c := range choices {
				c.index = i
			}
		}
		writeJSON(w, http.StatusOK, s.final(g, id, created, choices, u))
		return
	}
	if g.includeUsage {
		_ = stream.send(response{ID: id, Object: objectName(g.chat, true), Created: created, Model: s.cfg.Model, Choices: []any{}, Usage: u})
	}
	_ = stream.done()
}

// acquire takes one slot for each of n sequences. Requests take their
// slots one at a time (turn holds the right to take them), so that two
// requests that each need several never hold half of what they need and
// wait on each other. A stream carries keep-alive comments meanwhile.
// held is how many slots it took, to give back.
func (s *Server) acquire(ctx context.Context, n int, quiet <-chan time.Time, stream *sse) (held int, ok bool) {
	haveTurn := false
	defer func() {
		if haveTurn {
			<-s.turn
		}
	}()
	for held < n {
		turn, slots := s.turn, s.slots
		if haveTurn {
			turn = nil // already ours
		} else {
			slots = nil // not before our turn
		}
		select {
		case turn <- struct{}{}:
			haveTurn = true
		case slots <- struct{}{}:
			held++
		case <-quiet:
			if stream.comment() != nil {
				return held, false
			}
		case <-ctx.Done():
			return held, false
		}
	}
	return held, true
}

// finishChoice ends a choice's text once its generation has returned.
func (s *Server) finishChoice(c *choice, g generation) {
	c.finish = "length"
	if c.tracker.stopped {
		c.finish = "stop"
	}
	c.tail = c.tracker.flush()
	if g.logprobs {
		c.lps = c.lps[:c.tracker.covered()]
	}
}

// streamEnd sends what a finished choice held back, then its finish
// reason.
func (s *Server) streamEnd(stream *sse, id string, created int64, c *choice, g generation) error {
	tail := piece{index: c.index, text: c.tail}
	if g.logprobs && c.streamed < len(c.lps) {
		tail.lps, c.streamed = c.lps[c.streamed:], len(c.lps)
	}
	if tail.text != "" || len(tail.lps) > 0 {
		if err := stream.send(s.textChunk(g.chat, id, created, tail, nil, g)); err != nil {
			return err
		}
	}
	if g.chat {
		return stream.send(s.chatChunk(id, created, c.index, &chatDelta{}, nil, &c.finish))
	}
	return stream.send(s.textChunk(false, id, created, piece{index: c.index}, &c.finish, g))
}

// finite keeps a logprob JSON can carry: −9999 stands for an impossible
// token, as in OpenAI's answers.
func finite(lp float64) float64 {
	if math.IsNaN(lp) || lp < -9999 {
		return -9999
	}
	return lp
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

func (s *Server) textChunk(chat bool, id string, created int64, p piece, finish *string, g generation) response {
	if chat {
		var lp *chatLogprobs
		if g.logprobs {
			lp = s.chatLogprobs(p.lps, g.tokenIDs)
		}
		return s.chatChunk(id, created, p.index, &chatDelta{Content: &p.text}, lp, finish)
	}
	var lp *completionLogprobs
	if g.logprobs && finish == nil {
		lp = s.completionLogprobs(p.lps, g.tokenIDs)
	}
	return response{ID: id, Object: objectName(false, true), Created: created, Model: s.cfg.Model,
		Choices: []completionChoice{{Index: p.index, Text: p.text, Logprobs: lp, FinishReason: finish}}}
}

func (s *Server) chatChunk(id string, created int64, index int, d *chatDelta, lp *chatLogprobs, finish *string) response {
	return response{ID: id, Object: objectName(true, true), Created: created, Model: s.cfg.Model,
		Choices: []chatChoice{{Index: index, Delta: d, Logprobs: lp, FinishReason: finish}}}
}

func (s *Server) final(g generation, id string, created int64, choices []*choice, u *usage) response {
	r := response{ID: id, Object: objectName(g.chat, false), Created: created, Model: s.cfg.Model, Usage: u}
	if g.chat {
		out := make([]chatChoice, len(choices))
		for i, c := range choices {
			out[i] = chatChoice{Index: c.index, Message: &chatReply{Role: "assistant", Content: c.tracker.text()}, FinishReason: &c.finish}
			if g.logprobs {
				out[i].Logprobs = s.chatLogprobs(c.lps, g.tokenIDs)
			}
		}
		r.Choices = out
		return r
	}
	out := make([]completionChoice, len(choices))
	for i, c := range choices {
		out[i] = completionChoice{Index: c.index, Text: g.echo + c.tracker.text(), FinishReason: &c.finish}
		if g.logprobs {
			out[i].Logprobs = s.completionLogprobs(c.lps, g.tokenIDs)
		}
	}
	r.Choices = out
	return r
}

// tokenText is one id's text and bytes, or "token_id:N" when asIDs.
func (s *Server) tokenText(id int32, asIDs bool) (string, []int) {
	t := s.cfg.Tokenizer.Decode([]int{int(id)})
	if asIDs {
		t = "token_id:" + strconv.Itoa(int(id))
	}
	b := make([]int, len(t))
	for i := range len(t) {
		b[i] = int(t[i])
	}
	return t, b
}

func (s *Server) chatLogprobs(lps []tokenLogprob, asIDs bool) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatTokenLogprob, len(lps)), Refusal: nil}
	for i, t := range lps {
		text, b := s.tokenText(t.id, asIDs)
		e := chatTokenLogprob{Token: text, Logprob: t.lp, Bytes: b, TopLogprobs: make([]chatTopLogprob, len(t.top))}
		for j, alt := range t.top {
			at, ab := s.tokenText(alt.ID, asIDs)
			e.TopLogprobs[j] = chatTopLogprob{Token: at, Logprob: finite(alt.Logprob), Bytes: ab}
		}
		out.Content[i] = e
	}
	return out
}

func (s *Server) completionLogprobs(lps []tokenLogprob, asIDs bool) *completionLogprobs {
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, t := range lps {
		text, _ := s.tokenText(t.id, asIDs)
		out.Tokens = append(out.Tokens, text)
		out.TokenLogprobs = append(out.TokenLogprobs, t.lp)
		out.TextOffset = append(out.TextOffset, t.offset)
		top := make(map[string]float64, len(t.top))
		for _, alt := range t.top {
			at, _ := s.tokenText(alt.ID, asIDs)
			if _, dup := top[at]; !dup {
				top[at] = finite(alt.Logprob)
			}
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
	}
	return out
}

func (s *Server) logDone(g generation, id string, start time.Time, produced int, err error) {
	attrs := []any{"id", id, "chat", g.chat, "stream", g.stream, "choices", g.choices(), "prompt_tokens", len(g.prompt), "tokens", produced,
		"took", time.Since(start).Round(time.Millisecond)}
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
