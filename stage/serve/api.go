package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
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

func (s *Server) writeError(w http.ResponseWriter, e *apiError) {
	code := e.CodeStr
	if code == "" {
		code = e.Type
	}
	s.metrics.errors.WithLabelValues(code).Inc()
	if e.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

// completionRequest is POST /v1/completions: every field OpenAI
// documents, so that no client's ordinary request is refused for a name.
type completionRequest struct {
	Model            string             `json:"model"`
	Prompt           json.RawMessage    `json:"prompt"`
	BestOf           *int               `json:"best_of"`
	Echo             bool               `json:"echo"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	Logprobs         *int               `json:"logprobs"`
	MaxTokens        *int               `json:"max_tokens"`
	N                *int               `json:"n"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	Seed             *int64             `json:"seed"`
	Stop             json.RawMessage    `json:"stop"`
	Stream           bool               `json:"stream"`
	StreamOptions    *streamOptions     `json:"stream_options"`
	Suffix           *string            `json:"suffix"`
	Temperature      *float64           `json:"temperature"`
	TopP             *float64           `json:"top_p"`
	User             string             `json:"user"`
	// ReturnTokensAsTokenIDs is vLLM's extension: each logprobs token is
	// "token_id:N", so a client can tell apart ids the tokenizer decodes
	// alike (an evaluation harness, holopeer bench comparing outputs).
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
}

// chatRequest is POST /v1/chat/completions, every documented field.
type chatRequest struct {
	Model                string             `json:"model"`
	Messages             []chatMessage      `json:"messages"`
	Audio                json.RawMessage    `json:"audio"`
	FrequencyPenalty     *float64           `json:"frequency_penalty"`
	FunctionCall         json.RawMessage    `json:"function_call"`
	Functions            json.RawMessage    `json:"functions"`
	LogitBias            map[string]float64 `json:"logit_bias"`
	Logprobs             *bool              `json:"logprobs"`
	MaxCompletionTokens  *int               `json:"max_completion_tokens"`
	MaxTokens            *int               `json:"max_tokens"`
	Metadata             map[string]string  `json:"metadata"`
	Modalities           []string           `json:"modalities"`
	Moderation           json.RawMessage    `json:"moderation"`
	N                    *int               `json:"n"`
	ParallelToolCalls    *bool              `json:"parallel_tool_calls"`
	Prediction           json.RawMessage    `json:"prediction"`
	PresencePenalty      *float64           `json:"presence_penalty"`
	PromptCacheKey       string             `json:"prompt_cache_key"`
	PromptCacheOptions   json.RawMessage    `json:"prompt_cache_options"`
	PromptCacheRetention *string            `json:"prompt_cache_retention"`
	ReasoningEffort      *string            `json:"reasoning_effort"`
	ResponseFormat       *responseFormat    `json:"response_format"`
	SafetyIdentifier     string             `json:"safety_identifier"`
	Seed                 *int64             `json:"seed"`
	ServiceTier          *string            `json:"service_tier"`
	Stop                 json.RawMessage    `json:"stop"`
	Store                *bool              `json:"store"`
	Stream               bool               `json:"stream"`
	StreamOptions        *streamOptions     `json:"stream_options"`
	Temperature          *float64           `json:"temperature"`
	ToolChoice           json.RawMessage    `json:"tool_choice"`
	Tools                json.RawMessage    `json:"tools"`
	TopLogprobs          *int               `json:"top_logprobs"`
	TopP                 *float64           `json:"top_p"`
	User                 string             `json:"user"`
	Verbosity            *string            `json:"verbosity"`
	WebSearchOptions     json.RawMessage    `json:"web_search_options"`
	// ReturnTokensAsTokenIDs: as in completionRequest (vLLM's extension).
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
}

type streamOptions struct {
	IncludeUsage       bool `json:"include_usage"`
	IncludeObfuscation bool `json:"include_obfuscation"`
}

type responseFormat struct {
	Type       string          `json:"type"`
	JSONSchema json.RawMessage `json:"json_schema"`
}

type chatMessage struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         string          `json:"name"`
	Refusal      *string         `json:"refusal"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	ToolCallID   string          `json:"tool_call_id"`
	FunctionCall json.RawMessage `json:"function_call"`
	Audio        json.RawMessage `json:"audio"`
}

type contentPart struct {
	Type       string          `json:"type"`
	Text       string          `json:"text"`
	Refusal    string          `json:"refusal"`
	ImageURL   json.RawMessage `json:"image_url"`
	InputAudio json.RawMessage `json:"input_audio"`
	File       json.RawMessage `json:"file"`
}

// unsupported refuses a documented parameter this server cannot honour,
// so that a client never gets an answer that silently ignored it.
func unsupported(param, format string, a ...any) *apiError {
	return badRequest(param, "unsupported", format, a...)
}

// given says a raw field is present and not null.
func given(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// nonEmpty says a raw field holds something: not absent, null, [] or {}.
func nonEmpty(raw json.RawMessage) bool {
	t := strings.TrimSpace(string(raw))
	return given(raw) && t != "[]" && t != "{}"
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
		at := fmt.Sprintf("messages[%d]", i)
		role := m.Role
		switch role {
		case "system", "user", "assistant":
		case "developer":
			role = "system"
		case "tool", "function":
			return "", unsupported(at+".role", "role %q: this server does not support tools or functions", m.Role)
		default:
			return "", badRequest(at+".role", "invalid_value", "role %q: use system, user or assistant", m.Role)
		}
		switch {
		case nonEmpty(m.ToolCalls):
			return "", unsupported(at+".tool_calls", "this server does not support tools, so a message cannot carry tool_calls")
		case given(m.FunctionCall):
			return "", unsupported(at+".function_call", "this server does not support functions, so a message cannot carry function_call")
		case given(m.Audio):
			return "", unsupported(at+".audio", "this server generates text only; a message cannot refer to audio")
		}
		text, err := messageText(m.Content, at+".content")
		if err != nil {
			return "", err
		}
		if text == "" && m.Refusal != nil {
			text = *m.Refusal
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

func messageText(raw json.RawMessage, param string) (string, *apiError) {
	if !given(raw) {
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
		return "", badRequest(param, "invalid_type", "content must be a string or an array of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		switch p.Type {
		case "text":
			b.WriteString(p.Text)
		case "refusal":
			b.WriteString(p.Refusal)
		case "image_url", "input_audio", "file":
			return "", unsupported(fmt.Sprintf("%s[%d].type", param, i), "content part of type %q: this server reads text only", p.Type)
		default:
			return "", badRequest(fmt.Sprintf("%s[%d].type", param, i), "invalid_value", "content part of type %q: use text", p.Type)
		}
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
	presence    *float64
	frequency   *float64
	logitBias   map[string]float64
	tokenIDs    bool
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
	// n choices are returned, the best n of bestOf generated (by total
	// logprob) when bestOf > n.
	n, bestOf int
	// logprobs asks for each output token's logprob and the topLogprobs
	// most likely alternatives.
	logprobs    bool
	topLogprobs int
	tokenIDs    bool // logprobs name tokens "token_id:N"
	// echo is the prompt's text, put before each completion.
	echo string
}

// choices is how many sequences g generates.
func (g generation) choices() int { return max(g.n, g.bestOf) }

// maxChoices bounds n and best_of whatever the batch (OpenAI's own cap).
const maxChoices = 128

// check validates the shared fields against the prompt; defaultMax is
// the output length when max_tokens is absent (0: as long as allowed).
func (s *Server) check(c common, prompt []int32, defaultMax int) (generation, *apiError) {
	g := generation{prompt: prompt, stream: c.stream, n: 1, sampling: Sampling{Temperature: 1, TopP: 1}, tokenIDs: c.tokenIDs}
	if c.model != "" && c.model != s.cfg.Model {
		e := badRequest("model", "model_not_found", "The model `%s` does not exist; this server serves `%s`", c.model, s.cfg.Model)
		e.status = http.StatusNotFound
		return g, e
	}
	if c.n != nil {
		if *c.n < 1 || *c.n > maxChoices {
			return g, badRequest("n", "invalid_value", "n = %d: ask for 1 to %d choices", *c.n, maxChoices)
		}
		g.n = *c.n
	}
	if g.n > s.cfg.MaxBatch {
		return g, badRequest("n", "invalid_value", "n = %d: this server generates at most %d choices per request (its batch)", g.n, s.cfg.MaxBatch)
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
	for _, pen := range []struct {
		name string
		v    *float64
		to   *float64
	}{{"presence_penalty", c.presence, &g.sampling.PresencePenalty}, {"frequency_penalty", c.frequency, &g.sampling.FrequencyPenalty}} {
		if pen.v == nil {
			continue
		}
		if !(*pen.v >= -2 && *pen.v <= 2) {
			return g, badRequest(pen.name, "invalid_value", "%s %g: use a value from -2 to 2", pen.name, *pen.v)
		}
		*pen.to = *pen.v
	}
	if len(c.logitBias) > 0 {
		g.sampling.LogitBias = make(map[int32]float64, len(c.logitBias))
		for k, b := range c.logitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 || id >= int64(s.cfg.Vocab) {
				return g, badRequest("logit_bias", "invalid_value", "logit_bias key %q: use a token id from 0 to %d", k, s.cfg.Vocab-1)
			}
			if !(b >= -100 && b <= 100) {
				return g, badRequest("logit_bias", "invalid_value", "logit_bias %g for token %d: use a value from -100 to 100", b, id)
			}
			g.sampling.LogitBias[int32(id)] = b
		}
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
		s.writeError(w, e)
		return
	}
	s.run(w, r, g, newID("cmpl-"))
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	g, e := s.parseChat(r)
	if e != nil {
		s.writeError(w, e)
		return
	}
	s.run(w, r, g, newID("chatcmpl-"))
}

// maxCompletionLogprobs is OpenAI's bound on a completion's logprobs.
const maxCompletionLogprobs = 5

// maxTopLogprobs is OpenAI's bound on a chat completion's top_logprobs.
const maxTopLogprobs = 20

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
	if req.Suffix != nil && *req.Suffix != "" {
		return generation{}, unsupported("suffix", "suffix: this server does not insert text; leave suffix out")
	}
	g, e := s.check(common{req.Model, req.MaxTokens, req.Temperature, req.TopP, req.Stop, req.Seed, req.Stream, req.StreamOptions, req.N,
		req.PresencePenalty, req.FrequencyPenalty, req.LogitBias, req.ReturnTokensAsTokenIDs}, prompt, 16)
	if e != nil {
		return g, e
	}
	if lp := req.Logprobs; lp != nil {
		if *lp < 0 || *lp > maxCompletionLogprobs {
			return g, badRequest("logprobs", "invalid_value", "logprobs %d: use a value from 0 to %d", *lp, maxCompletionLogprobs)
		}
		g.logprobs, g.topLogprobs = true, *lp
	}
	if b := req.BestOf; b != nil {
		switch {
		case *b < g.n:
			return g, badRequest("best_of", "invalid_value", "best_of %d must be at least n (%d)", *b, g.n)
		case *b > s.cfg.MaxBatch:
			return g, badRequest("best_of", "invalid_value", "best_of %d: this server generates at most %d sequences per request (its batch)", *b, s.cfg.MaxBatch)
		case *b > g.n && g.stream:
			return g, badRequest("best_of", "invalid_value", "best_of cannot be used with stream: the best are chosen at the end")
		}
		g.bestOf = *b
	}
	if req.Echo {
		if g.logprobs {
			return g, unsupported("echo", "echo with logprobs: this server does not score the prompt's tokens")
		}
		g.echo = s.echoText(req.Prompt, prompt)
	}
	return g, nil
}

// echoText is the prompt as echo shows it: the text given, or the
// decoding of the ids given (without the BOS the server put in front).
func (s *Server) echoText(raw json.RawMessage, prompt []int32) string {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return text
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil && len(texts) == 1 {
		return texts[0]
	}
	ids := make([]int, len(prompt))
	for i, id := range prompt {
		ids[i] = int(id)
	}
	return s.cfg.Tokenizer.Decode(ids)
}

// parseChat reads and checks a chat completion request.
func (s *Server) parseChat(r *http.Request) (generation, *apiError) {
	var req chatRequest
	if e := decodeBody(r, s.cfg.MaxBodyBytes, &req); e != nil {
		return generation{}, e
	}
	if e := chatUnsupported(&req); e != nil {
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
	g, e := s.check(common{req.Model, maxTokens, req.Temperature, req.TopP, req.Stop, req.Seed, req.Stream, req.StreamOptions, req.N,
		req.PresencePenalty, req.FrequencyPenalty, req.LogitBias, req.ReturnTokensAsTokenIDs}, prompt, 0)
	if e != nil {
		return g, e
	}
	g.logprobs = req.Logprobs != nil && *req.Logprobs
	if k := req.TopLogprobs; k != nil {
		switch {
		case *k < 0 || *k > maxTopLogprobs:
			return g, badRequest("top_logprobs", "invalid_value", "top_logprobs %d: use a value from 0 to %d", *k, maxTopLogprobs)
		case !g.logprobs && *k > 0:
			return g, badRequest("top_logprobs", "invalid_value", "top_logprobs needs logprobs: true")
		}
		g.topLogprobs = *k
	}
	g.chat = true
	g.stops = append(g.stops, chatStops...)
	return g, nil
}

// chatUnsupported refuses the documented chat parameters this server
// cannot honour. Those that do not change what is generated (user,
// metadata, service_tier, prediction, prompt_cache_key, …) are accepted.
func chatUnsupported(req *chatRequest) *apiError {
	switch {
	case nonEmpty(req.Tools):
		return unsupported("tools", "tools are not supported by this server yet; send the request without tools")
	case given(req.ToolChoice) && string(req.ToolChoice) != `"none"`:
		return unsupported("tool_choice", "tool_choice: this server does not support tools; leave it out or use \"none\"")
	case nonEmpty(req.Functions):
		return unsupported("functions", "functions are not supported by this server; send the request without them")
	case given(req.FunctionCall) && string(req.FunctionCall) != `"none"`:
		return unsupported("function_call", "function_call: this server does not support functions; leave it out or use \"none\"")
	case given(req.Audio):
		return unsupported("audio", "audio output is not supported: this server generates text only")
	case given(req.Moderation):
		return unsupported("moderation", "moderation is not supported by this server")
	case given(req.WebSearchOptions):
		return unsupported("web_search_options", "web search is not supported by this server")
	case req.ReasoningEffort != nil:
		return unsupported("reasoning_effort", "reasoning_effort is not supported with this model: it does not reason before answering")
	case req.Verbosity != nil:
		return unsupported("verbosity", "verbosity is not supported with this model")
	case req.Store != nil && *req.Store:
		return unsupported("store", "store: this server does not store completions")
	}
	for _, m := range req.Modalities {
		if m != "text" {
			return unsupported("modalities", "modality %q: this server generates text only", m)
		}
	}
	if f := req.ResponseFormat; f != nil {
		switch f.Type {
		case "", "text":
		case "json_object", "json_schema":
			return unsupported("response_format", "response_format of type %s is not supported by this server; use text", f.Type)
		default:
			return badRequest("response_format.type", "invalid_value", "response_format type %q: use text", f.Type)
		}
	}
	return nil
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
		s.writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}
