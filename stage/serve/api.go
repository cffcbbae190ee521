package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
)

// apiError is an OpenAI-style error body and its HTTP status.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	CodeStr string  `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

// MarshalJSON writes param and code as null when unset, as OpenAI does.
func (e *apiError) MarshalJSON() ([]byte, error) {
	var code *string
	if e.CodeStr != "" {
		code = &e.CodeStr
	}
	return json.Marshal(struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}{e.Message, e.Type, e.Param, code})
}

func badRequest(param, code, format string, a ...any) *apiError {
	e := &apiError{status: http.StatusBadRequest, Type: "invalid_request_error", Message: fmt.Sprintf(format, a...), CodeStr: code}
	if param != "" {
		e.Param = &param
	}
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

// completionRequest is POST /v1/completions.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	Stop          json.RawMessage `json:"stop"`
	Seed          *int64          `json:"seed"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	N             *int            `json:"n"`
	User          string          `json:"user"`
}

// chatRequest is POST /v1/chat/completions.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	N                   *int            `json:"n"`
	User                string          `json:"user"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

var unknownField = regexp.MustCompile(`^json: unknown field "(.*)"$`)

// decodeBody reads one JSON object into v, refusing unknown fields,
// trailing data and bodies over limit.
func decodeBody(r *http.Request, limit int64, v any) *apiError {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return badRequest("", "invalid_body", "could not read the request body: %v", err)
	}
	if int64(len(body)) > limit {
		return badRequest("", "body_too_large", "the request body is larger than %d bytes", limit)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.Is(err, io.EOF):
			return badRequest("", "invalid_json", "the request body is empty; send a JSON object")
		case unknownField.MatchString(err.Error()):
			name := unknownField.FindStringSubmatch(err.Error())[1]
			return badRequest(name, "unknown_parameter", "Unrecognized request argument supplied: %s", name)
		case errors.As(err, &te):
			return badRequest(te.Field, "invalid_type", "Invalid type for '%s': expected %s, got a JSON %s", te.Field, jsonType(te.Type.String()), te.Value)
		}
		return badRequest("", "invalid_json", "We could not parse the JSON body of your request: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("", "invalid_json", "the request body holds more than one JSON value")
	}
	return nil
}

func jsonType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "*"):
		return jsonType(goType[1:])
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "float"):
		return "a number"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return "an object"
}

// parsePrompt reads a completion prompt: a string, an array of one
// string, an array of token ids, or an array of one such array.
func (s *Server) parsePrompt(raw json.RawMessage) ([]int32, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "missing_required_parameter", "you must provide a prompt")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return s.encode(text, "prompt")
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return nil, badRequest("prompt", "invalid_value", "%d prompts given; this server takes one prompt per request", len(texts))
		}
		return s.encode(texts[0], "prompt")
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) != nil {
		var batch [][]int64
		if json.Unmarshal(raw, &batch) != nil {
			return nil, badRequest("prompt", "invalid_type", "prompt must be a string, an array of one string, or an array of token ids")
		}
		if len(batch) != 1 {
			return nil, badRequest("prompt", "invalid_value", "%d prompts given; this server takes one prompt per request", len(batch))
		}
		ids = batch[0]
	}
	if len(ids) == 0 {
		return nil, badRequest("prompt", "invalid_value", "the prompt holds no tokens")
	}
	if len(ids) > s.cfg.MaxPromptTokens {
		return nil, s.promptTooLong(len(ids))
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(s.cfg.Vocab) {
			return nil, badRequest("prompt", "invalid_value", "token id %d at %d is outside the vocabulary 0..%d", id, i, s.cfg.Vocab-1)
		}
		out[i] = int32(id)
	}
	return out, nil
}

// encode tokenizes text with the tokenizer's BOS in front, if it has one.
func (s *Server) encode(text, param string) ([]int32, *apiError) {
	var out []int32
	if s.bos >= 0 {
		out = append(out, int32(s.bos))
	}
	// Refuse a text that cannot fit before tokenizing all of it: no
	// tokenizer here makes a token of less than one byte.
	if len(text) > 64*s.cfg.MaxPromptTokens+64 {
		return nil, s.promptTooLong(len(text))
	}
	for _, id := range s.cfg.Tokenizer.Encode(text) {
		out = append(out, int32(id))
	}
	if len(out) == 0 {
		return nil, badRequest(param, "invalid_value", "the prompt is empty")
	}
	if len(out) > s.cfg.MaxPromptTokens {
		return nil, s.promptTooLong(len(out))
	}
	return out, nil
}

func (s *Server) promptTooLong(n int) *apiError {
	return badRequest("prompt", "context_length_exceeded", "the prompt has at least %d tokens; this server takes at most %d", n, s.cfg.MaxPromptTokens)
}

// chatTemplate renders messages as holopeer's role-tagged lines.
func chatTemplate(msgs []chatMessage) (string, *apiError) {
	if len(msgs) == 0 {
		return "", badRequest("messages", "missing_required_parameter", "messages must hold at least one message")
	}
	var b strings.Builder
	for i, m := range msgs {
		role := m.Role
		switch role {
		case "system", "user", "assistant":
		case "developer":
			role = "system"
		default:
			return "", badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value", "role %q: use system, user or assistant", m.Role)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return "", badRequest(fmt.Sprintf("messages[%d].content", i), "invalid_type", "%v", err)
		}
		b.WriteString(role)
		b.WriteString(": ")
		b.WriteString(text)
		b.WriteString("\n")
	}
	b.WriteString("assistant:")
	return b.String(), nil
}

// chatStops are where a model following the template starts a new turn.
var chatStops = []string{"\nuser:", "\nsystem:"}

func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []contentPart
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&parts); err != nil {
		return "", errors.New("content must be a string or an array of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q: only text is supported", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// parseStop reads stop: null, a string, or an array of up to 4 strings.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) != nil {
		return nil, badRequest("stop", "invalid_type", "stop must be a string or an array of strings")
	}
	if len(many) > 4 {
		return nil, badRequest("stop", "invalid_value", "%d stop sequences; at most 4", len(many))
	}
	var out []string
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// common are the sampling and limit fields both endpoints share.
type common struct {
	model       string
	maxTokens   *int
	temperature *float64
	topP        *float64
	stop        json.RawMessage
	seed        *int64
	stream      bool
	opts        *streamOptions
	n           *int
}

// generation is a checked request, ready to run.
type generation struct {
	chat         bool
	prompt       []int32
	maxNew       int
	sampling     Sampling
	stops        []string
	stream       bool
	includeUsage bool
}

// check validates the shared fields against the prompt; defaultMax is
// the output length when max_tokens is absent (0: as long as allowed).
func (s *Server) check(c common, prompt []int32, defaultMax int) (generation, *apiError) {
	g := generation{prompt: prompt, stream: c.stream, sampling: Sampling{Temperature: 1, TopP: 1}}
	if c.model != "" && c.model != s.cfg.Model {
		e := badRequest("model", "model_not_found", "The model `%s` does not exist; this server serves `%s`", c.model, s.cfg.Model)
		e.status = http.StatusNotFound
		return g, e
	}
	if c.n != nil && *c.n != 1 {
		return g, badRequest("n", "invalid_value", "n = %d: this server generates one choice per request", *c.n)
	}
	if c.opts != nil {
		if !c.stream {
			return g, badRequest("stream_options", "invalid_value", "stream_options is only allowed with stream: true")
		}
		g.includeUsage = c.opts.IncludeUsage
	}
	if t := c.temperature; t != nil {
		if !(*t >= 0 && *t <= 2) {
			return g, badRequest("temperature", "invalid_value", "temperature %g: use a value from 0 (greedy) to 2", *t)
		}
		g.sampling.Temperature = *t
	}
	if p := c.topP; p != nil {
		if !(*p > 0 && *p <= 1) {
			return g, badRequest("top_p", "invalid_value", "top_p %g: use a value in (0, 1]", *p)
		}
		g.sampling.TopP = *p
	}
	if c.seed != nil {
		g.sampling.Seed = uint64(*c.seed)
	} else {
		g.sampling.Seed = newSeed()
	}
	stops, err := parseStop(c.stop)
	if err != nil {
		return g, err
	}
	g.stops = stops
	room := s.cfg.ContextTokens - len(prompt)
	if room < 1 {
		return g, s.contextExceeded(len(prompt), 1)
	}
	if c.maxTokens != nil {
		m := *c.maxTokens
		switch {
		case m < 1:
			return g, badRequest("max_tokens", "invalid_value", "max_tokens %d: ask for at least 1", m)
		case m > s.cfg.MaxOutputTokens:
			return g, badRequest("max_tokens", "invalid_value", "max_tokens %d: this server generates at most %d tokens per request", m, s.cfg.MaxOutputTokens)
		case m > room:
			return g, s.contextExceeded(len(prompt), m)
		}
		g.maxNew = m
	} else {
		g.maxNew = min(s.cfg.MaxOutputTokens, room)
		if defaultMax > 0 {
			g.maxNew = min(g.maxNew, defaultMax)
		}
	}
	return g, nil
}

func (s *Server) contextExceeded(prompt, out int) *apiError {
	return badRequest("max_tokens", "context_length_exceeded",
		"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d for the completion).",
		s.cfg.ContextTokens, prompt+out, prompt, out)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	g, e := s.parseCompletion(r)
	if e != nil {
		writeError(w, e)
		return
	}
	s.run(w, r, g, newID("cmpl-"))
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	g, e := s.parseChat(r)
	if e != nil {
		writeError(w, e)
		return
	}
	s.run(w, r, g, newID("chatcmpl-"))
}

// parseCompletion reads and checks a completion request.
func (s *Server) parseCompletion(r *http.Request) (generation, *apiError) {
	var req completionRequest
	if e := decodeBody(r, s.cfg.MaxBodyBytes, &req); e != nil {
		return generation{}, e
	}
	prompt, e := s.parsePrompt(req.Prompt)
	if e != nil {
		return generation{}, e
	}
	return s.check(common{req.Model, req.MaxTokens, req.Temperature, req.TopP, req.Stop, req.Seed, req.Stream, req.StreamOptions, req.N}, prompt, 16)
}

// parseChat reads and checks a chat completion request.
func (s *Server) parseChat(r *http.Request) (generation, *apiError) {
	var req chatRequest
	if e := decodeBody(r, s.cfg.MaxBodyBytes, &req); e != nil {
		return generation{}, e
	}
	text, e := chatTemplate(req.Messages)
	if e != nil {
		return generation{}, e
	}
	prompt, e := s.encode(text, "messages")
	if e != nil {
		return generation{}, e
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		if maxTokens != nil {
			return generation{}, badRequest("max_completion_tokens", "invalid_value", "give max_tokens or max_completion_tokens, not both")
		}
		maxTokens = req.MaxCompletionTokens
	}
	g, e := s.check(common{req.Model, maxTokens, req.Temperature, req.TopP, req.Stop, req.Seed, req.Stream, req.StreamOptions, req.N}, prompt, 0)
	if e != nil {
		return g, e
	}
	g.chat = true
	g.stops = append(g.stops, chatStops...)
	return g, nil
}

// modelObject is one entry of GET /v1/models.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) modelObject() modelObject {
	return modelObject{ID: s.cfg.Model, Object: "model", Created: s.cfg.Now().Unix(), OwnedBy: "holopeer"}
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []modelObject{s.modelObject()}})
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("id"); id != s.cfg.Model {
		e := badRequest("model", "model_not_found", "The model `%s` does not exist; this server serves `%s`", id, s.cfg.Model)
		e.status = http.StatusNotFound
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}
