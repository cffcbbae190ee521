package tokenizer

import (
	"fmt"
	"strings"
	"sync"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// GPT-2's vocabulary: 50256 merged byte sequences and "<|endoftext|>".
const (
	gpt2EOS   = 50256
	gpt2Vocab = 50257
	gpt2EOT   = "<|endoftext|>"
)

type gpt2 struct {
	codec tiktoken.Codec
}

// The codec's tables are large and immutable; build them once.
var gpt2Codec = sync.OnceValues(func() (tiktoken.Codec, error) {
	return tiktoken.Get(tiktoken.R50kBase)
})

// GPT2 returns GPT-2's byte-level BPE tokenizer (tiktoken's r50k_base,
// whose vocabulary is compiled in, so it needs no network). Vocabulary
// 50257; EOS is "<|endoftext|>", 50256.
func GPT2() (Tokenizer, error) {
	c, err := gpt2Codec()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: gpt2: %w", err)
	}
	return gpt2{codec: c}, nil
}

func (g gpt2) Encode(text string) []int {
	var ids []int
	for i, part := range strings.Split(text, gpt2EOT) {
		if i > 0 {
			ids = append(ids, gpt2EOS)
		}
		if part == "" {
			continue
		}
		// The codec errs only on a regexp timeout, and r50k_base sets
		// none; an error here is a broken invariant, not bad input.
		raw, _, err := g.codec.Encode(part)
		if err != nil {
			panic(fmt.Sprintf("tokenizer: gpt2 encode: %v", err))
		}
		for _, id := range raw {
			ids = append(ids, int(id))
		}
	}
	return ids
}

func (g gpt2) Decode(ids []int) string {
	var sb strings.Builder
	run := make([]uint, 0, len(ids))
	flush := func() {
		if len(run) == 0 {
			return
		}
		// Every id below 50256 is in the vocabulary, so this cannot fail.
		s, err := g.codec.Decode(run)
		if err != nil {
			panic(fmt.Sprintf("tokenizer: gpt2 decode: %v", err))
		}
		sb.WriteString(s)
		run = run[:0]
	}
	for _, id := range ids {
		switch {
		case id >= 0 && id < gpt2EOS:
			run = append(run, uint(id))
		case id == gpt2EOS:
			flush()
			sb.WriteString(gpt2EOT)
		}
	}
	flush()
	return sb.String()
}

func (gpt2) VocabSize() int { return gpt2Vocab }
func (gpt2) Name() string   { return "gpt2" }
func (gpt2) EOS() int       { return gpt2EOS }
