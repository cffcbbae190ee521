package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// TestSamplerPenalties checks OpenAI's formula on logits worked by hand:
// logit − count·frequency − [count>0]·presence, then logit_bias.
func TestSamplerPenalties(t *testing.T) {
	logits := []float32{3, 2.6, 2, 0}
	// Greedy with frequency 0.3: 0 (3), 0 (2.7 > 2.6), 1 (2.6 > 2.4), 0
	// (2.4 > 2.3), 1 (2.3 > 2.1), 0 (2.1 > 2.0) …
	sm := NewSampler(Sampling{FrequencyPenalty: 0.3})
	var got []int32
	for range 6 {
		got = append(got, sm.Pick(logits))
	}
	if fmt.Sprint(got) != "[0 0 1 0 1 0]" {
		t.Fatalf("frequency penalty: %v", got)
	}
	// Presence 0.5 counts once: 0 (3), 1 (2.6 > 2.5), 0 (2.5 > 2.1), 0 …
	sm = NewSampler(Sampling{PresencePenalty: 0.5})
	got = got[:0]
	for range 4 {
		got = append(got, sm.Pick(logits))
	}
	if fmt.Sprint(got) != "[0 1 0 0]" {
		t.Fatalf("presence penalty: %v", got)
	}
	// Bias lifts the last token above all; −100 bans the first.
	sm = NewSampler(Sampling{LogitBias: map[int32]float64{3: 5, 0: -100}})
	if tok := sm.Pick(logits); tok != 3 {
		t.Fatalf("bias: %d", tok)
	}
	lp, top := sm.Logprobs(3, 2)
	// Adjusted logits 5−100·…: {−97, 2.6, 2, 5}.
	adj := []float64{-97, 2.6, 2, 5}
	var z float64
	for _, v := range adj {
		z += math.Exp(v)
	}
	if math.Abs(lp-(5-math.Log(z))) > 1e-6 || len(top) != 2 || top[0].ID != 3 || top[1].ID != 1 ||
		math.Abs(top[1].Logprob-(2.6-math.Log(z))) > 1e-6 {
		t.Fatalf("logprobs %g %+v", lp, top)
	}
	if logits[0] != 3 || logits[3] != 0 {
		t.Fatal("the sampler changed the engine's logits")
	}
}

func decodeCompletion(t *testing.T, body []byte) completionResp {
	t.Helper()
	var r completionResp
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return r
}

// TestPenaltiesAndBias: the API's penalties and logit_bias reach the
// sampler: its output is the model's under the same settings, and not the
// output without them.
func TestPenaltiesAndBias(t *testing.T) {
	f := newFixture(t, nil)
	plain := f.direct(t, "aaaa", 40, Sampling{}, true)
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"aaaa","max_tokens":40,"temperature":0,"presence_penalty":1.5,"frequency_penalty":2}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	got := decodeCompletion(t, body).Choices[0].Text
	want := f.direct(t, "aaaa", 40, Sampling{PresencePenalty: 1.5, FrequencyPenalty: 2}, true)
	if got != want || got == plain {
		t.Fatalf("penalised %q, the model penalised %q, unpenalised %q", got, want, plain)
	}
	// Every token drawn at temperature 1 is the one biased by +100.
	code, body, _ = post(t, f.url+"/v1/completions", `{"prompt":"x","max_tokens":12,"logit_bias":{"81":100},"seed":1}`)
	if got := decodeCompletion(t, body).Choices[0].Text; code != 200 || got != strings.Repeat("Q", 12) {
		t.Fatalf("%d: biased output %q", code, got)
	}
	// A greedy output's first byte, banned, never appears.
	ban := plain[0]
	code, body, _ = post(t, f.url+"/v1/completions", fmt.Sprintf(`{"prompt":"aaaa","max_tokens":40,"temperature":0,"logit_bias":{"%d":-100}}`, ban))
	if got := decodeCompletion(t, body).Choices[0].Text; code != 200 || strings.IndexByte(got, ban) >= 0 || got == "" {
		t.Fatalf("%d: %q holds the banned %q", code, got, ban)
	}
}

// greedyLogprobs is what greedy decoding gives, computed here from the
// model's own logits: each token and its log-softmax.
func (f *fixture) greedyLogprobs(t *testing.T, prompt string, n int) ([]int, []float64) {
	t.Helper()
	ids := tokenizer.Byte().Encode(prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	var toks []int
	var lps []float64
	err := f.engine.Local.Generate(context.Background(), p, n, func(l []float32) int32 {
		best := 0
		var z float64
		for i, v := range l {
			if v > l[best] {
				best = i
			}
		}
		for _, v := range l {
			z += math.Exp(float64(v - l[best]))
		}
		lps = append(lps, -math.Log(z))
		return int32(best)
	}, func(tok int32) bool {
		toks = append(toks, int(tok))
		return tok == tokenizer.ByteEOS
	})
	if err != nil {
		t.Fatal(err)
	}
	return toks, lps
}

type lpResp struct {
	Choices []struct {
		Index    int    `json:"index"`
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
			Content       []struct {
				Token       string  `json:"token"`
				Logprob     float64 `json:"logprob"`
				Bytes       []int   `json:"bytes"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
}

func TestLogprobs(t *testing.T) {
	f := newFixture(t, nil)
	toks, want := f.greedyLogprobs(t, "Once", 10)
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"Once","max_tokens":10,"temperature":0,"logprobs":3}`)
	var r lpResp
	if err := json.Unmarshal(body, &r); err != nil || code != 200 {
		t.Fatalf("%d %v %s", code, err, body)
	}
	lp := r.Choices[0].Logprobs
	n := len(lp.Tokens)
	if n == 0 || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n || n > len(toks) {
		t.Fatalf("logprobs %s", body)
	}
	off := 0
	for i := range n {
		if lp.TextOffset[i] != off {
			t.Fatalf("token %d at offset %d, want %d", i, lp.TextOffset[i], off)
		}
		off += len(tokenizer.Byte().Decode(toks[i : i+1]))
		if math.Abs(lp.TokenLogprobs[i]-want[i]) > 1e-4 {
			t.Fatalf("token %d: logprob %g, the model's %g", i, lp.TokenLogprobs[i], want[i])
		}
		if len(lp.TopLogprobs[i]) == 0 || len(lp.TopLogprobs[i]) > 3 {
			t.Fatalf("token %d: top %v", i, lp.TopLogprobs[i])
		}
		best := math.Inf(-1)
		for _, v := range lp.TopLogprobs[i] {
			best = max(best, v)
		}
		if math.Abs(best-want[i]) > 1e-4 { // greedy picks the most likely
			t.Fatalf("token %d: best alternative %g, picked %g", i, best, want[i])
		}
	}

	// Chat: the same numbers in the chat shape, streamed or not.
	req := `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":2%s}`
	code, body, _ = post(t, f.url+"/v1/chat/completions", fmt.Sprintf(req, ""))
	var c lpResp
	if err := json.Unmarshal(body, &c); err != nil || code != 200 {
		t.Fatalf("%d %v %s", code, err, body)
	}
	content := c.Choices[0].Logprobs.Content
	var joined strings.Builder
	for _, e := range content {
		if len(e.TopLogprobs) != 2 || e.TopLogprobs[0].Logprob < e.TopLogprobs[1].Logprob || len(e.Bytes) != len(e.Token) {
			t.Fatalf("entry %+v", e)
		}
		for _, b := range e.Bytes {
			joined.WriteByte(byte(b))
		}
	}
	if text := c.Choices[0].Message.Content; !strings.HasPrefix(viaJSON(joined.String()), text) || len(content) == 0 {
		t.Fatalf("tokens %q do not make the text %q", joined.String(), text)
	}
	resp, err := http.Post(f.url+"/v1/chat/completions", "application/json", strings.NewReader(fmt.Sprintf(req, `,"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var streamed []float64
	for _, line := range strings.Split(readAll(t, resp), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch lpResp
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatal(err)
		}
		if l := ch.Choices[0].Logprobs; l != nil {
			for _, e := range l.Content {
				streamed = append(streamed, e.Logprob)
			}
		}
	}
	if len(streamed) != len(content) {
		t.Fatalf("streamed %d logprobs, whole %d", len(streamed), len(content))
	}
	for i := range streamed {
		if streamed[i] != content[i].Logprob {
			t.Fatalf("streamed logprob %d: %g, whole %g", i, streamed[i], content[i].Logprob)
		}
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestChoices: n choices share a seed but not their draws; each is the
// model's own sampling with that seed and the choice's stream, whole or
// streamed; usage counts all of them.
func TestChoices(t *testing.T) {
	f := newFixture(t, nil)
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"The","max_tokens":12,"temperature":1,"seed":7,"n":2}`)
	r := decodeCompletion(t, body)
	if code != 200 || len(r.Choices) != 2 {
		t.Fatalf("%d %s", code, body)
	}
	for i := range 2 {
		want := f.direct(t, "The", 12, Sampling{Temperature: 1, TopP: 1, Seed: 7, Stream: uint64(i)}, true)
		if r.Choices[i].Text != want {
			t.Fatalf("choice %d: %q, the model %q", i, r.Choices[i].Text, want)
		}
	}
	if r.Choices[0].Text == r.Choices[1].Text {
		t.Fatalf("both choices are %q", r.Choices[0].Text)
	}
	if r.Usage.CompletionTokens < 2 || r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens {
		t.Fatalf("usage %+v", r.Usage)
	}
	resp, err := http.Post(f.url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"The","max_tokens":12,"temperature":1,"seed":7,"n":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	texts := map[int]string{}
	finished := map[int]bool{}
	for _, line := range strings.Split(readAll(t, resp), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Index        int     `json:"index"`
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			texts[c.Index] += c.Text
			finished[c.Index] = finished[c.Index] || c.FinishReason != nil
		}
	}
	for i := range 2 {
		if texts[i] != r.Choices[i].Text || !finished[i] {
			t.Fatalf("streamed choice %d: %q (finished %v), whole %q", i, texts[i], finished[i], r.Choices[i].Text)
		}
	}
}

// TestBestOf: of best_of sequences, the one with the higher total logprob
// comes back.
func TestBestOf(t *testing.T) {
	f := newFixture(t, nil)
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"The","max_tokens":10,"temperature":1,"seed":11,"best_of":2}`)
	r := decodeCompletion(t, body)
	if code != 200 || len(r.Choices) != 1 {
		t.Fatalf("%d %s", code, body)
	}
	score := func(stream uint64) (string, float64) {
		sm := NewSampler(Sampling{Temperature: 1, TopP: 1, Seed: 11, Stream: stream})
		var out []int
		var total float64
		err := f.engine.Local.Generate(context.Background(), []int32{'T', 'h', 'e'}, 10, func(l []float32) int32 {
			tok := sm.Pick(l)
			lp, _ := sm.Logprobs(tok, 0)
			total += lp
			return tok
		}, func(tok int32) bool {
			if tok == tokenizer.ByteEOS {
				return true
			}
			out = append(out, int(tok))
			return false
		})
		if err != nil {
			t.Fatal(err)
		}
		return viaJSON(tokenizer.Byte().Decode(out)), total
	}
	a, sa := score(0)
	b, sb := score(1)
	want := a
	if sb > sa {
		want = b
	}
	if r.Choices[0].Text != want || a == b {
		t.Fatalf("best_of gave %q; candidates %q (%g) and %q (%g)", r.Choices[0].Text, a, sa, b, sb)
	}
}

func TestEcho(t *testing.T) {
	f := newFixture(t, nil)
	for _, prompt := range []string{`"Once upon"`, `[79,110,99,101,32,117,112,111,110]`} {
		code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":6,"temperature":0,"echo":true}`)
		r := decodeCompletion(t, body)
		if want := "Once upon" + f.direct(t, "Once upon", 6, Sampling{}, true); code != 200 || r.Choices[0].Text != want {
			t.Fatalf("%s: %d %q, want %q", prompt, code, r.Choices[0].Text, want)
		}
	}
	resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Once upon","max_tokens":6,"temperature":0,"echo":true,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var text string
	for _, e := range readStream(t, resp.Body) {
		text += e.Choices[0].Text
	}
	if want := "Once upon" + f.direct(t, "Once upon", 6, Sampling{}, true); text != want {
		t.Fatalf("streamed echo %q, want %q", text, want)
	}
}

// TestDocumentedParameters: requests that carry every documented
// parameter at a value this server honours or that changes nothing are
// answered, not refused.
func TestDocumentedParameters(t *testing.T) {
	f := newFixture(t, nil)
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"tiny","prompt":"hi","best_of":1,"echo":false,"frequency_penalty":0,"logit_bias":{},"logprobs":0,
			"max_tokens":4,"n":1,"presence_penalty":0,"seed":1,"stop":null,"stream":false,"stream_options":null,"suffix":null,
			"temperature":1,"top_p":1,"user":"u-1"}`},
		{"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"developer","content":"Be brief.","name":"d"},
			{"role":"user","content":[{"type":"text","text":"Hi"}],"name":"ann"},
			{"role":"assistant","content":null,"refusal":"no","tool_calls":[],"audio":null},
			{"role":"user","content":"again"}],
			"audio":null,"frequency_penalty":0,"function_call":"none","functions":[],"logit_bias":{"65":1},"logprobs":false,
			"max_completion_tokens":4,"metadata":{"k":"v"},"modalities":["text"],"moderation":null,"n":1,"parallel_tool_calls":true,
			"prediction":{"type":"content","content":"Hello"},"presence_penalty":0,"prompt_cache_key":"k","prompt_cache_options":{},
			"prompt_cache_retention":"in_memory","reasoning_effort":null,"response_format":{"type":"text"},"safety_identifier":"s",
			"seed":3,"service_tier":"auto","stop":["\n\n"],"store":false,"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false},
			"temperature":0.7,"tool_choice":"none","tools":[],"top_logprobs":0,"top_p":0.9,"user":"u","verbosity":null,"web_search_options":null}`},
	} {
		code, body, _ := post(t, f.url+tc.path, tc.body)
		if code != 200 {
			t.Errorf("%s: %d %s", tc.path, code, body)
		}
	}
}

// TestTokensAsIDs: vLLM's return_tokens_as_token_ids names each logprobs
// token by its id, so ids the tokenizer decodes alike (here, every id
// above the byte range decodes to "") stay apart.
func TestTokensAsIDs(t *testing.T) {
	f := newFixture(t, nil)
	toks, _ := f.greedyLogprobs(t, "Once", 6)
	code, body, _ := post(t, f.url+"/v1/completions", `{"prompt":"Once","max_tokens":6,"temperature":0,"logprobs":0,"return_tokens_as_token_ids":true}`)
	var r lpResp
	if err := json.Unmarshal(body, &r); err != nil || code != 200 {
		t.Fatalf("%d %v %s", code, err, body)
	}
	lp := r.Choices[0].Logprobs
	if len(lp.Tokens) == 0 {
		t.Fatalf("no tokens: %s", body)
	}
	for i, tok := range lp.Tokens {
		if want := fmt.Sprintf("token_id:%d", toks[i]); tok != want {
			t.Fatalf("token %d is %q, want %q", i, tok, want)
		}
	}
	code, body, _ = post(t, f.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0,"logprobs":true,"return_tokens_as_token_ids":true}`)
	if code != 200 || !strings.Contains(string(body), `"token":"token_id:`) {
		t.Fatalf("chat: %d %s", code, body)
	}
}
