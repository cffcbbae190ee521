package serve

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzRequests: request bodies from the network are either accepted
// within the limits or refused with an OpenAI error; nothing panics and
// nothing accepted breaks a limit.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,"stop":["\n"],"seed":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3]}`,
		`{"prompt":[[4,5]]}`,
		`{"prompt":["x"],"n":1,"user":"u"}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}],"max_completion_tokens":3}`,
		`{"prompt":"a","frequency_penalty":1}`,
		`{"prompt": `,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	srv, err := New(Config{Model: "tiny", Engine: &Local{}, Tokenizer: byteTok(), Vocab: 257, ContextTokens: 64, MaxPromptTokens: 32, MaxOutputTokens: 16})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		path := "/v1/completions"
		parse := srv.parseCompletion
		if chat {
			path, parse = "/v1/chat/completions", srv.parseChat
		}
		g, e := parse(httptest.NewRequest("POST", path, strings.NewReader(body)))
		if e != nil {
			if e.status < 400 || e.status > 499 || e.Message == "" || e.Type == "" {
				t.Fatalf("%q: error %+v", body, e)
			}
			return
		}
		if len(g.prompt) == 0 || len(g.prompt) > 32 || g.maxNew < 1 || g.maxNew > 16 || len(g.prompt)+g.maxNew > 64 {
			t.Fatalf("%q accepted with %d prompt tokens and %d new", body, len(g.prompt), g.maxNew)
		}
		for _, id := range g.prompt {
			if id < 0 || id >= 257 {
				t.Fatalf("%q: token %d", body, id)
			}
		}
		if g.sampling.Temperature < 0 || g.sampling.Temperature > 2 || g.sampling.TopP <= 0 || g.sampling.TopP > 1 {
			t.Fatalf("%q: sampling %+v", body, g.sampling)
		}
	})
}
