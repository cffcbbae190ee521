package serve

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fuzzServer is the API in front of a real (tiny) model with small
// limits, so that every accepted request also generates quickly.
func fuzzServer(f *testing.F) *Server {
	local, err := NewLocal(testModel(f).Stage)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := New(Config{Model: "tiny", Engine: local, Tokenizer: byteTok(), Vocab: 257, ContextTokens: 64,
		MaxPromptTokens: 32, MaxOutputTokens: 8, MaxBatch: 3, MaxQueue: 4, Logger: discard()})
	if err != nil {
		f.Fatal(err)
	}
	return srv
}

var fuzzSeeds = []string{
	`{"model":"tiny","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,"stop":["\n"],"seed":3,"stream":true,"stream_options":{"include_usage":true}}`,
	`{"prompt":[1,2,3],"logprobs":2,"n":2}`,
	`{"prompt":[[4,5]],"echo":true,"best_of":3,"n":2}`,
	`{"prompt":["x"],"n":1,"user":"u","presence_penalty":-2,"frequency_penalty":2,"logit_bias":{"65":100,"66":-100}}`,
	`{"prompt":"a","frequency_penalty":1,"suffix":"","logprobs":5,"stream":true}`,
	`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}],"max_completion_tokens":3}`,
	`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"logprobs":true,"top_logprobs":4,"n":3,"stream":true,"stream_options":{"include_usage":true}}`,
	`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"}`,
	`{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{}}}`,
	`{"messages":[{"role":"developer","content":"x","name":"n"}],"response_format":{"type":"text"},"seed":-1,"logit_bias":{"256":-100}}`,
	`{"prompt": `,
}

// checkAnswer: a request is answered within the limits, or refused with
// an OpenAI error; never a server error, never more than was asked.
func checkAnswer(t *testing.T, body string, w *httptest.ResponseRecorder) {
	out := w.Body.String()
	switch {
	case w.Code >= 400 && w.Code < 500:
		var e errorBody
		if err := json.Unmarshal([]byte(out), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("%q: %d with %q", body, w.Code, out)
		}
		return
	case w.Code != 200:
		t.Fatalf("%q: %d %s", body, w.Code, out)
	}
	if w.Header().Get("Content-Type") == "text/event-stream" {
		if !strings.HasSuffix(out, "data: [DONE]\n\n") || strings.Contains(out, `"error"`) {
			t.Fatalf("%q: stream %s", body, out)
		}
		return
	}
	var r completionResp
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Choices) == 0 || len(r.Choices) > 3 || r.Usage == nil {
		t.Fatalf("%q: %v %s", body, err, out)
	}
	if r.Usage.PromptTokens > 32 || r.Usage.CompletionTokens > 8*3 || r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens {
		t.Fatalf("%q: usage %+v", body, *r.Usage)
	}
}

// fuzzRequest runs body through the whole handler and the parser alone.
func fuzzRequest(t *testing.T, srv *Server, path, body string, parse func(*http.Request) (generation, *apiError)) {
	g, e := parse(httptest.NewRequest("POST", path, strings.NewReader(body)))
	if e != nil {
		if e.status < 400 || e.status > 499 || e.Message == "" || e.Type == "" {
			t.Fatalf("%q: error %+v", body, e)
		}
	} else {
		if len(g.prompt) == 0 || len(g.prompt) > 32 || g.maxNew < 1 || g.maxNew > 8 || len(g.prompt)+g.maxNew > 64 || g.choices() > 3 || g.n < 1 {
			t.Fatalf("%q accepted with %d prompt tokens, %d new, %d choices", body, len(g.prompt), g.maxNew, g.choices())
		}
		for _, id := range g.prompt {
			if id < 0 || id >= 257 {
				t.Fatalf("%q: token %d", body, id)
			}
		}
		s := g.sampling
		if s.Temperature < 0 || s.Temperature > 2 || s.TopP <= 0 || s.TopP > 1 || s.PresencePenalty < -2 || s.PresencePenalty > 2 ||
			s.FrequencyPenalty < -2 || s.FrequencyPenalty > 2 || g.topLogprobs < 0 || g.topLogprobs > 20 {
			t.Fatalf("%q: sampling %+v", body, g)
		}
		for id, b := range s.LogitBias {
			if id < 0 || id >= 257 || b < -100 || b > 100 {
				t.Fatalf("%q: bias %d %g", body, id, b)
			}
		}
	}
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	srv.Handler().ServeHTTP(w, req)
	checkAnswer(t, body, w)
}

func FuzzCompletions(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body string) { fuzzRequest(t, srv, "/v1/completions", body, srv.parseCompletion) })
}

func FuzzChatCompletions(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body string) { fuzzRequest(t, srv, "/v1/chat/completions", body, srv.parseChat) })
}

// FuzzGuard: whatever the Host, Origin, Authorization and Content-Type,
// a request reaches the API only if each passes its check.
func FuzzGuard(f *testing.F) {
	f.Add("127.0.0.1:8000", "", "Bearer k", "application/json", "POST")
	f.Add("evil.example", "https://evil.example", "Bearer k", "text/plain", "POST")
	f.Add("[::1]", "https://ok.example", "bearer  k ", "application/json; charset=utf-8", "OPTIONS")
	f.Add("gpu.lan.", "null", "", "", "GET")
	local, err := NewLocal(testModel(f).Stage)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := New(Config{Model: "tiny", Engine: local, Tokenizer: byteTok(), Vocab: 257, ContextTokens: 64, MaxOutputTokens: 2,
		AllowedHosts: []string{"gpu.lan"}, APIKey: "k", CORSOrigins: []string{"https://ok.example"}, Logger: discard()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host, origin, auth, ct, method string) {
		req, err := http.NewRequest(method, "http://x/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"a"}]}`))
		if err != nil {
			return
		}
		req.Host = host
		for k, v := range map[string]string{"Origin": origin, "Authorization": auth, "Content-Type": ct} {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, req)
		if w.Code != 200 {
			return
		}
		h := normalHost(host)
		if ip := net.ParseIP(h); h != "localhost" && h != "gpu.lan" && (ip == nil || !ip.IsLoopback()) {
			t.Fatalf("Host %q got through", host)
		}
		if origin != "" && strings.TrimSuffix(origin, "/") != "https://ok.example" {
			t.Fatalf("Origin %q got through", origin)
		}
		if method == "POST" && !strings.Contains(req.Header.Get("Authorization"), "k") {
			t.Fatalf("Authorization %q got through", auth)
		}
		if method == "POST" && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "application/json") {
			t.Fatalf("Content-Type %q got through", ct)
		}
	})
}
