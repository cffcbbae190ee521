package main

import (
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// TestDemoServeFitsAChat: the demo's serving limits (testnet/serve.yaml on
// the model testnet/demo.yaml trains) take the official client's first
// chat call, a system and a user message with no max_tokens, without
// context_length_exceeded. The model is demo.yaml's architecture, its
// weights untrained: only the limits are under test.
func TestDemoServeFitsAChat(t *testing.T) {
	train, err := manifest.Load(filepath.Join("..", "..", "testnet", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sm, err := manifest.Load(filepath.Join("..", "..", "testnet", "serve.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sm.ApplyDefaults()
	md := train.Model
	cfg := model.Config{Vocab: 257, Dim: md.Dim, Layers: md.Layers, Heads: md.Heads, KVHeads: md.KVHeads, FFNDim: md.FFNDim, MaxSeq: md.MaxSeq}
	m, err := model.New(cfg, model.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	local, err := serve.NewLocal(m.Stage)
	if err != nil {
		t.Fatal(err)
	}
	ctxTokens, maxPrompt, maxOutput := serveLimits(cfg.MaxSeq, sm.Serve)
	api, err := serve.New(serve.Config{Model: sm.Name, Engine: local, Tokenizer: tokenizer.Byte(), Vocab: 257,
		ContextTokens: ctxTokens, MaxPromptTokens: maxPrompt, MaxOutputTokens: maxOutput, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api.Handler())
	t.Cleanup(hs.Close)
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	c, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "demo",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are a helpful assistant. Answer in one short sentence."),
			openai.UserMessage("Tell me what a swarm of peers can train together, and how it keeps the data private."),
		},
	})
	if err != nil {
		t.Fatalf("serve.yaml's limits (context %d, prompt %d, output %d): %v", ctxTokens, maxPrompt, maxOutput, err)
	}
	if c.Usage.CompletionTokens < 1 {
		t.Fatalf("%+v", c)
	}
}
