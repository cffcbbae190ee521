package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// testModel is a small random model over the byte vocabulary with
// weights of order one, so that generations differ by prompt. Its head
// rows of ids other than printable ASCII are zero, so it mostly writes
// readable bytes (their logits are 0, most printable ones' far above).
func testModel(t testing.TB) *model.Model {
	t.Helper()
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 128}
	m, err := model.New(cfg, model.WithSeed(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	modeltest.Perturb(t, modeltest.Weights{Stream: 4, Norm: 0.2, Matrix: 0.5, PrintableHead: true}, m.Stage)
	return m
}

// viaJSON is s as a client reads it from a JSON string: bytes that are
// not UTF-8 become U+FFFD.
func viaJSON(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

// gated holds every generation until its gate opens (nil: never held),
// so that tests can fill the queue; the generation itself is Local's.
type gated struct {
	*Local
	gate chan struct{}
}

func (g *gated) Generate(ctx context.Context, prompt []int32, maxNew int, pick func([]float32) int32, emit func(int32) bool) error {
	if g.gate != nil {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Local.Generate(ctx, prompt, maxNew, pick, emit)
}

type fixture struct {
	srv    *Server
	url    string
	engine *gated
	model  *model.Model
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	m := testModel(t)
	local, err := NewLocal(m.Stage)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{engine: &gated{Local: local}, model: m}
	cfg := Config{
		Model: "tiny", Engine: f.engine, Tokenizer: tokenizer.Byte(), Vocab: 257,
		ContextTokens: 128, MaxPromptTokens: 64, MaxOutputTokens: 48, MaxBatch: 2, MaxQueue: 4, Logger: discard(),
	}
	if mod != nil {
		mod(&cfg)
	}
	if f.srv, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(f.srv.Handler())
	t.Cleanup(hs.Close)
	f.url = hs.URL
	return f
}

func post(t *testing.T, url, body string) (int, []byte, http.Header) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// direct generates with the model itself, as the API should.
func (f *fixture) direct(t *testing.T, prompt string, n int, s Sampling, eos bool) string {
	t.Helper()
	ids := tokenizer.Byte().Encode(prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	var out []int
	sm := NewSampler(s)
	err := f.engine.Local.Generate(context.Background(), p, n, sm.Pick, func(tok int32) bool {
		if eos && tok == tokenizer.ByteEOS {
			return true
		}
		out = append(out, int(tok))
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return viaJSON(tokenizer.Byte().Decode(out))
}

type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// readStream collects a server-sent event stream's JSON events up to
// [DONE].
func readStream(t *testing.T, r io.Reader) []completionResp {
	t.Helper()
	var out []completionResp
	sc := bufio.NewScanner(r)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, ":") {
			continue // blank, or a comment (keep-alive)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an event line: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if done {
			t.Fatal("an event after [DONE]")
		}
		var c completionResp
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		out = append(out, c)
	}
	if !done {
		t.Fatal("the stream ended without [DONE]")
	}
	return out
}

func TestCompletionGreedyMatchesModel(t *testing.T) {
	f := newFixture(t, nil)
	code, body, _ := post(t, f.url+"/v1/completions", `{"model":"tiny","prompt":"Once upon","max_tokens":20,"temperature":0}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var r completionResp
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	want := f.direct(t, "Once upon", 20, Sampling{}, true)
	if r.Object != "text_completion" || r.Model != "tiny" || !strings.HasPrefix(r.ID, "cmpl-") || len(r.Choices) != 1 {
		t.Fatalf("response %s", body)
	}
	if r.Choices[0].Text != want {
		t.Fatalf("text %q, the model generates %q", r.Choices[0].Text, want)
	}
	if r.Usage == nil || r.Usage.PromptTokens != 9 || r.Usage.TotalTokens != 9+r.Usage.CompletionTokens {
		t.Fatalf("usage %s", body)
	}
}

func TestCompletionStreamEqualsWhole(t *testing.T) {
	f := newFixture(t, nil)
	req := `{"prompt":"The swarm","max_tokens":30,"temperature":0.8,"top_p":0.9,"seed":42%s}`
	_, body, _ := post(t, f.url+"/v1/completions", fmt.Sprintf(req, ""))
	var whole completionResp
	if err := json.Unmarshal(body, &whole); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(req, `,"stream":true,"stream_options":{"include_usage":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := readStream(t, resp.Body)
	var text strings.Builder
	var finish string
	for _, e := range events[:len(events)-1] {
		if e.Object != "text_completion" || len(e.Choices) != 1 {
			t.Fatalf("chunk %+v", e)
		}
		text.WriteString(e.Choices[0].Text)
		if fr := e.Choices[0].FinishReason; fr != nil {
			finish = *fr
		}
	}
	if last := events[len(events)-1]; last.Usage == nil || len(last.Choices) != 0 {
		t.Fatalf("the last event is not the usage: %+v", last)
	}
	if text.String() != whole.Choices[0].Text || finish != *whole.Choices[0].FinishReason {
		t.Fatalf("stream %q (%s), whole %q (%s)", text.String(), finish, whole.Choices[0].Text, *whole.Choices[0].FinishReason)
	}
	want := f.direct(t, "The swarm", 30, Sampling{Temperature: 0.8, TopP: 0.9, Seed: 42}, true)
	if whole.Choices[0].Text != want {
		t.Fatalf("seeded sampling %q, the model with the same seed %q", whole.Choices[0].Text, want)
	}
	if len(events) < 3 {
		t.Fatalf("%d events: nothing was streamed piece by piece", len(events))
	}
}

func TestChatStream(t *testing.T) {
	f := newFixture(t, nil)
	resp, err := http.Post(f.url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":12,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := readStream(t, resp.Body)
	first := events[0].Choices[0].Delta
	if events[0].Object != "chat.completion.chunk" || first == nil || first.Role == nil || *first.Role != "assistant" {
		t.Fatalf("first chunk %+v", events[0])
	}
	var text strings.Builder
	for _, e := range events[1:] {
		if d := e.Choices[0].Delta; d != nil && d.Content != nil {
			text.WriteString(*d.Content)
		}
	}
	want := f.direct(t, "system: Be brief.\nuser: Hi\nassistant:", 12, Sampling{}, true)
	if i := strings.Index(want, "\nuser:"); i >= 0 {
		want = want[:i]
	}
	if text.String() != want {
		t.Fatalf("chat %q, the model generates %q", text.String(), want)
	}
	if fr := events[len(events)-1].Choices[0].FinishReason; fr == nil {
		t.Fatal("no finish reason at the end")
	}
}

func TestChatWhole(t *testing.T) {
	f := newFixture(t, nil)
	code, body, _ := post(t, f.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hello"}],"max_completion_tokens":8,"temperature":0}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var r completionResp
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "chat.completion" || r.Choices[0].Message == nil || r.Choices[0].Message.Role != "assistant" {
		t.Fatalf("response %s", body)
	}
}

func TestStopString(t *testing.T) {
	f := newFixture(t, nil)
	full := f.direct(t, "abc", 40, Sampling{}, true)
	if len(full) < 6 {
		t.Skipf("the model's output %q is too short to cut", full)
	}
	stop := full[3:5]
	want := full[:strings.Index(full, stop)]
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"prompt":"abc","max_tokens":40,"temperature":0,"stop":[%q],"stream":%v}`, stop, stream)
		resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var text, finish string
		if stream {
			for _, e := range readStream(t, resp.Body) {
				text += e.Choices[0].Text
				if fr := e.Choices[0].FinishReason; fr != nil {
					finish = *fr
				}
			}
		} else {
			var r completionResp
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != 1 {
				t.Fatalf("%d: %v %+v", resp.StatusCode, err, r)
			}
			text, finish = r.Choices[0].Text, *r.Choices[0].FinishReason
		}
		resp.Body.Close()
		if text != want || finish != "stop" {
			t.Fatalf("stream %v, stop %q: %q (%s), want %q", stream, stop, text, finish, want)
		}
	}
}

func TestModels(t *testing.T) {
	f := newFixture(t, nil)
	resp, err := http.Get(f.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "tiny" || list.Data[0].Object != "model" {
		t.Fatalf("%+v", list)
	}
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t, nil)
	long := strings.Repeat("x", 70)
	cases := []struct {
		path, body string
		status     int
		param      string
		code       string
	}{
		{"/v1/completions", `{"prompt": "a",`, 400, "", "invalid_json"},
		{"/v1/completions", ``, 400, "", "invalid_json"},
		{"/v1/completions", `{"prompt":"a"} {"prompt":"b"}`, 400, "", "invalid_json"},
		{"/v1/completions", `{"prompt":"a","frequency_penalti":1}`, 400, "frequency_penalti", "unknown_parameter"},
		{"/v1/completions", `{"prompt":"a","frequency_penalty":2.5}`, 400, "frequency_penalty", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","presence_penalty":-3}`, 400, "presence_penalty", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","logit_bias":{"x":1}}`, 400, "logit_bias", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","logit_bias":{"257":1}}`, 400, "logit_bias", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","logit_bias":{"65":101}}`, 400, "logit_bias", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","logprobs":6}`, 400, "logprobs", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","logprobs":1,"echo":true}`, 400, "echo", "unsupported"},
		{"/v1/completions", `{"prompt":"a","suffix":"z"}`, 400, "suffix", "unsupported"},
		{"/v1/completions", `{"prompt":"a","n":2,"best_of":1}`, 400, "best_of", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","best_of":2,"stream":true}`, 400, "best_of", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","stream_options":{"include_usage":true,"x":1}}`, 400, "x", "unknown_parameter"},
		{"/v1/completions", `{"prompt":"a","max_tokens":"ten"}`, 400, "max_tokens", "invalid_type"},
		{"/v1/completions", `{"max_tokens":3}`, 400, "prompt", "missing_required_parameter"},
		{"/v1/completions", `{"prompt":["a","b"]}`, 400, "prompt", "invalid_value"},
		{"/v1/completions", `{"prompt":[1,2,999]}`, 400, "prompt", "invalid_value"},
		{"/v1/completions", `{"prompt":"` + long + `"}`, 400, "prompt", "context_length_exceeded"},
		{"/v1/completions", `{"prompt":"a","max_tokens":49}`, 400, "max_tokens", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "max_tokens", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","temperature":2.5}`, 400, "temperature", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","top_p":0}`, 400, "top_p", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","n":3}`, 400, "n", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","n":0}`, 400, "n", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","stop":["1","2","3","4","5"]}`, 400, "stop", "invalid_value"},
		{"/v1/completions", `{"prompt":"a","stop":7}`, 400, "stop", "invalid_type"},
		{"/v1/completions", `{"prompt":"a","stream_options":{"include_usage":true}}`, 400, "stream_options", "invalid_value"},
		{"/v1/completions", `{"model":"gpt-4","prompt":"a"}`, 404, "model", "model_not_found"},
		{"/v1/chat/completions", `{"messages":[]}`, 400, "messages", "missing_required_parameter"},
		{"/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, 400, "messages[0].role", "invalid_value"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x","tool_calls":[{"id":"1"}]}]}`, 400, "messages[0].tool_calls", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x","colour":1}]}`, 400, "colour", "unknown_parameter"},
		{"/v1/chat/completions", `{"messages":[{"role":"tool","content":"x","tool_call_id":"1"}]}`, 400, "messages[0].role", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, 400, "messages[0].content", "invalid_type"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, 400, "tools", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"}`, 400, "tool_choice", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]}`, 400, "functions", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`, 400, "response_format", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"s"}}}`, 400, "response_format", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}`, 400, "response_format.type", "invalid_value"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"modalities":["text","audio"]}`, 400, "modalities", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"audio":{"voice":"alloy","format":"mp3"}}`, 400, "audio", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"low"}`, 400, "reasoning_effort", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"store":true}`, 400, "store", "unsupported"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, 400, "top_logprobs", "invalid_value"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs", "invalid_value"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"max_completion_tokens":2}`, 400, "max_completion_tokens", "invalid_value"},
		{"/v1/nothing", `{}`, 404, "", "not_found"},
	}
	for _, tc := range cases {
		code, body, _ := post(t, f.url+tc.path, tc.body)
		var e errorBody
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s %s: not an error body: %s", tc.path, tc.body, body)
			continue
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		code2 := ""
		if e.Error.Code != nil {
			code2 = *e.Error.Code
		}
		if code != tc.status || param != tc.param || code2 != tc.code {
			t.Errorf("%s %s: %d param %q code %q (%s), want %d %q %q", tc.path, tc.body, code, param, code2, e.Error.Message, tc.status, tc.param, tc.code)
		}
	}
	// Context: a prompt of 64 bytes leaves 64 of the 128.
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":[`+strings.TrimSuffix(strings.Repeat("1,", 64), ",")+`],"max_tokens":48}`)
	if code != 200 {
		t.Fatalf("a prompt and output within the limits: %d %s", code, body)
	}
	resp, err := http.Get(f.url + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET /v1/completions: %d allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func TestContextLength(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ContextTokens, c.MaxPromptTokens, c.MaxOutputTokens = 40, 30, 30 })
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"`+strings.Repeat("y", 20)+`","max_tokens":25}`)
	var e errorBody
	_ = json.Unmarshal(body, &e)
	if code != 400 || e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" {
		t.Fatalf("%d %s", code, body)
	}
	// Without max_tokens a chat request gets what is left.
	code, body, _ = post(t, f.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"`+strings.Repeat("y", 10)+`"}],"temperature":0}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
}

// TestQueueFull: with every slot busy and the queue full, a request is
// refused with 429 and an error body; the held requests then complete.
func TestQueueFull(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, func(c *Config) { c.MaxBatch, c.MaxQueue = 1, 2 })
	f.engine.gate = gate
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, _ = post(t, f.url+"/v1/completions", `{"prompt":"q","max_tokens":4}`)
		}()
	}
	// Wait until all three are admitted (one generating, two queued).
	for f.srv.pending.Load() < 3 {
		runtime.Gosched()
	}
	code, body, hdr := post(t, f.url+"/v1/completions", `{"prompt":"q","max_tokens":4}`)
	var e errorBody
	_ = json.Unmarshal(body, &e)
	if code != 429 || e.Error.Type != "rate_limit_error" || hdr.Get("Retry-After") == "" {
		t.Fatalf("a request over the queue: %d %s", code, body)
	}
	close(gate)
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Fatalf("held request %d: %d", i, c)
		}
	}
}

// TestStreamKeepAlive: a stream that waits (here, for a held
// generation) carries comment lines, and then its events as usual.
func TestStreamKeepAlive(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, func(c *Config) { c.StreamKeepAlive = 5 * time.Millisecond })
	f.engine.gate = gate
	resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"k","max_tokens":5,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != ": keep-alive\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(gate)
	var text string
	for _, e := range readStream(t, br) {
		text += e.Choices[0].Text
	}
	if want := f.direct(t, "k", 5, Sampling{}, true); text != want {
		t.Fatalf("%q after the wait, want %q", text, want)
	}
}

// TestTenConcurrent: ten streaming requests at once all complete, each
// with the model's own output for its prompt.
func TestTenConcurrent(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBatch, c.MaxQueue = 4, 16 })
	var wg sync.WaitGroup
	texts := make([]string, 10)
	errs := make([]error, 10)
	for i := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"prompt":"request %d","max_tokens":10,"temperature":0,"stream":true}`, i)
			resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var c completionResp
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					errs[i] = err
					return
				}
				texts[i] += c.Choices[0].Text
			}
		}()
	}
	wg.Wait()
	for i := range texts {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if want := f.direct(t, fmt.Sprintf("request %d", i), 10, Sampling{}, true); texts[i] != want {
			t.Fatalf("request %d: %q, want %q", i, texts[i], want)
		}
	}
}
