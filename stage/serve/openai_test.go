package serve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// officialClient serves the fixture's model with Server.Serve on a
// loopback socket and returns OpenAI's own Go client pointed at it.
func officialClient(t *testing.T, mod func(*Config), opts ...option.RequestOption) (*fixture, openai.Client) {
	t.Helper()
	f := newFixture(t, mod)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- f.srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	opts = append([]option.RequestOption{
		option.WithBaseURL("http://" + ln.Addr().String() + "/v1/"), option.WithAPIKey("sk-test"),
		option.WithMaxRetries(0), option.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}),
	}, opts...)
	return f, openai.NewClient(opts...)
}

// apiError is err as the official client types it.
func openaiError(t *testing.T, err error) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("%v (%T) is not an *openai.Error", err, err)
	}
	return e
}

func TestOpenAIClient(t *testing.T) {
	// A chat call's system and user messages alone are 73 tokens of the
	// byte tokenizer: the prompt limit must leave room for them.
	f, client := officialClient(t, func(c *Config) { c.APIKey, c.MaxPromptTokens, c.MaxOutputTokens = "sk-test", 96, 64 })
	ctx := t.Context()

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != "tiny" || page.Data[0].OwnedBy != "holopeer" {
			t.Fatalf("%+v", page.Data)
		}
		m, err := client.Models.Get(ctx, "tiny")
		if err != nil || m.ID != "tiny" {
			t.Fatalf("%v %+v", err, m)
		}
		_, err = client.Models.Get(ctx, "gpt-4o")
		if e := openaiError(t, err); e.StatusCode != 404 || e.Code != "model_not_found" {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("completion", func(t *testing.T) {
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon")},
			MaxTokens: openai.Int(20), Temperature: openai.Float(0),
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := f.direct(t, "Once upon", 20, Sampling{}, true); len(c.Choices) != 1 || c.Choices[0].Text != want {
			t.Fatalf("%+v, want %q", c.Choices, want)
		}
		if c.Usage.PromptTokens != 9 || c.Usage.TotalTokens != 9+c.Usage.CompletionTokens {
			t.Fatalf("usage %+v", c.Usage)
		}
	})

	system, user := "You are a helpful assistant.", "Say this is a test."
	template := "system: " + system + "\nuser: " + user + "\nassistant:"
	chatWant := func(n int) string {
		w := f.direct(t, template, n, Sampling{}, true)
		for _, s := range chatStops {
			if i := strings.Index(w, s); i >= 0 {
				w = w[:i]
			}
		}
		return w
	}
	chatParams := func() openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{
			Model:    "tiny",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(user)},
			// The client's defaults: no max_tokens (as many as the
			// context allows), penalties and temperature as OpenAI's.
			Temperature: openai.Float(0),
		}
	}

	t.Run("chat", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, chatParams())
		if err != nil {
			t.Fatal(err)
		}
		if want := chatWant(128 - len(template)); c.Choices[0].Message.Content != want || c.Choices[0].Message.Role != "assistant" {
			t.Fatalf("%q, want %q", c.Choices[0].Message.Content, want)
		}
		if c.Object != "chat.completion" || c.Usage.PromptTokens != int64(len(template)) {
			t.Fatalf("%+v", c)
		}
	})

	t.Run("stream with usage", func(t *testing.T) {
		p := chatParams()
		p.MaxCompletionTokens = openai.Int(24)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		s := client.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for s.Next() {
			acc.AddChunk(s.Current())
			chunks++
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if want := chatWant(24); len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want {
			t.Fatalf("streamed %+v, want %q", acc.Choices, want)
		}
		if acc.Usage.PromptTokens != int64(len(template)) || acc.Usage.CompletionTokens < 1 || acc.Usage.TotalTokens != acc.Usage.PromptTokens+acc.Usage.CompletionTokens {
			t.Fatalf("usage %+v", acc.Usage)
		}
		if chunks < 4 {
			t.Fatalf("%d chunks: nothing was streamed piece by piece", chunks)
		}

		cs := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("The swarm")},
			MaxTokens: openai.Int(16), Temperature: openai.Float(0),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text string
		var total int64
		for cs.Next() {
			for _, ch := range cs.Current().Choices {
				text += ch.Text
			}
			total += cs.Current().Usage.TotalTokens
		}
		if err := cs.Err(); err != nil {
			t.Fatal(err)
		}
		if want := f.direct(t, "The swarm", 16, Sampling{}, true); text != want || total < 10 {
			t.Fatalf("streamed completion %q (usage %d), want %q", text, total, want)
		}
	})

	t.Run("stop", func(t *testing.T) {
		full := f.direct(t, "abc", 40, Sampling{}, true)
		stop := full[4:6]
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("abc")},
			MaxTokens: openai.Int(40), Temperature: openai.Float(0),
			Stop: openai.CompletionNewParamsStopUnion{OfStringArray: []string{stop, "never-in-it"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := full[:strings.Index(full, stop)]; c.Choices[0].Text != want || c.Choices[0].FinishReason != "stop" {
			t.Fatalf("%q (%s), want %q", c.Choices[0].Text, c.Choices[0].FinishReason, want)
		}
	})

	t.Run("penalties", func(t *testing.T) {
		p := chatParams()
		p.MaxCompletionTokens = openai.Int(30)
		p.PresencePenalty = openai.Float(1.2)
		p.FrequencyPenalty = openai.Float(0.8)
		p.LogitBias = map[string]int64{"32": -100} // no spaces
		c, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		w := f.direct(t, template, 30, Sampling{PresencePenalty: 1.2, FrequencyPenalty: 0.8, LogitBias: map[int32]float64{32: -100}}, true)
		for _, s := range chatStops {
			if i := strings.Index(w, s); i >= 0 {
				w = w[:i]
			}
		}
		if got := c.Choices[0].Message.Content; got != w || got == chatWant(30) || strings.Contains(got, " ") {
			t.Fatalf("%q, the model with the same penalties %q", got, w)
		}
	})

	t.Run("logprobs", func(t *testing.T) {
		p := chatParams()
		p.MaxCompletionTokens = openai.Int(6)
		p.Logprobs = openai.Bool(true)
		p.TopLogprobs = openai.Int(3)
		c, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		lp := c.Choices[0].Logprobs.Content
		if len(lp) == 0 {
			t.Fatalf("no logprobs: %s", c.RawJSON())
		}
		for _, e := range lp {
			if len(e.TopLogprobs) != 3 || e.Logprob > 0 || e.TopLogprobs[0].Logprob != e.Logprob {
				t.Fatalf("greedy entry %+v", e)
			}
		}
		cc, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once")},
			MaxTokens: openai.Int(5), Temperature: openai.Float(0), Logprobs: openai.Int(2),
		})
		if err != nil {
			t.Fatal(err)
		}
		if l := cc.Choices[0].Logprobs; len(l.Tokens) != 5 || len(l.TokenLogprobs) != 5 || len(l.TopLogprobs) != 5 || len(l.TextOffset) != 5 {
			t.Fatalf("completion logprobs %+v", l)
		}
	})

	t.Run("n", func(t *testing.T) {
		p := chatParams()
		p.MaxCompletionTokens = openai.Int(10)
		p.Temperature = openai.Float(1)
		p.Seed = openai.Int(5)
		p.N = openai.Int(2)
		c, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 2 || c.Choices[0].Index != 0 || c.Choices[1].Index != 1 || c.Choices[0].Message.Content == c.Choices[1].Message.Content {
			t.Fatalf("%+v", c.Choices)
		}
	})

	t.Run("errors", func(t *testing.T) {
		p := chatParams()
		p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "get_weather"})}
		_, err := client.Chat.Completions.New(ctx, p)
		if e := openaiError(t, err); e.StatusCode != 400 || e.Code != "unsupported" || e.Param != "tools" || e.Type != "invalid_request_error" || !strings.Contains(e.Message, "tools") {
			t.Fatalf("tools: %+v", e)
		}
		p = chatParams()
		p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &openai.ResponseFormatJSONObjectParam{}}
		_, err = client.Chat.Completions.New(ctx, p)
		if e := openaiError(t, err); e.StatusCode != 400 || e.Code != "unsupported" || e.Param != "response_format" {
			t.Fatalf("json_object: %+v", e)
		}
		p = chatParams()
		p.Messages = append(p.Messages, openai.UserMessage(strings.Repeat("long ", 30)))
		_, err = client.Chat.Completions.New(ctx, p)
		if e := openaiError(t, err); e.StatusCode != 400 || e.Code != "context_length_exceeded" {
			t.Fatalf("too long: %+v", e)
		}
		p = chatParams()
		p.Model = "gpt-4o"
		_, err = client.Chat.Completions.New(ctx, p)
		if e := openaiError(t, err); e.StatusCode != 404 || e.Code != "model_not_found" || e.Param != "model" {
			t.Fatalf("unknown model: %+v", e)
		}
		_, err = client.Models.List(ctx, option.WithAPIKey("sk-wrong"))
		if e := openaiError(t, err); e.StatusCode != 401 || e.Code != "invalid_api_key" {
			t.Fatalf("wrong key: %+v", e)
		}
		// An error inside a stream comes as the client's typed error too.
		p = chatParams()
		p.N = openai.Int(9)
		s := client.Chat.Completions.NewStreaming(ctx, p)
		for s.Next() {
		}
		if e := openaiError(t, s.Err()); e.StatusCode != 400 || e.Param != "n" {
			t.Fatalf("streamed n=9: %+v", e)
		}
	})
}
