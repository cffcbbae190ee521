// Package tokenizer turns text into token ids and back for holopeer's
// models: a byte-level tokenizer for small demos, GPT-2's BPE (vocabulary
// embedded, works offline), and a loader for the Hugging Face
// tokenizer.json that ships with checkpoints users bring.
package tokenizer

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Tokenizer encodes text to ids and decodes ids to text. Implementations
// are safe for concurrent use.
type Tokenizer interface {
	// Encode tokenizes text. It adds no BOS/EOS of its own; special
	// tokens written out in the text (for example "<|endoftext|>") become
	// their ids.
	Encode(text string) []int
	// Decode turns ids back into text, skipping ids outside the
	// vocabulary. It returns the raw bytes the tokens stand for, never
	// U+FFFD for a piece that ends inside a multi-byte character. For the
	// byte, GPT-2 and byte-level tokenizers, decoding a stream piece by
	// piece and concatenating gives the text decoding it whole gives;
	// SentencePiece-style decoders drop the leading space of every call
	// (as Hugging Face's do), so stream those by decoding the whole
	// sequence and emitting what is new.
	Decode(ids []int) string
	// VocabSize is one more than the largest id Encode can return: the
	// rows an embedding table needs.
	VocabSize() int
	// Name identifies the tokenizer: "byte", "gpt2" or "hf:<path>".
	Name() string
	// EOS is the end-of-text id, or -1 if the tokenizer has none.
	EOS() int
}

// ErrUnsupported marks a tokenizer.json that uses a feature this package
// does not implement; the message names it.
var ErrUnsupported = errors.New("tokenizer: unsupported")

// BOS returns t's beginning-of-sequence id, or -1 if it has none. Only
// Hugging Face tokenizers that declare one (Llama's "<s>",
// "<|begin_of_text|>") have it.
func BOS(t Tokenizer) int {
	if b, ok := t.(interface{ BOS() int }); ok {
		return b.BOS()
	}
	return -1
}

// New builds a tokenizer from a spec: "byte", "gpt2", "hf" (the
// tokenizer.json in checkpointDir) or "hf:<path to tokenizer.json>".
func New(spec string, checkpointDir string) (Tokenizer, error) {
	switch {
	case spec == "byte":
		return Byte(), nil
	case spec == "gpt2":
		return GPT2()
	case spec == "hf":
		if checkpointDir == "" {
			return nil, errors.New(`tokenizer: "hf" needs a checkpoint directory holding tokenizer.json`)
		}
		return LoadHF(filepath.Join(checkpointDir, "tokenizer.json"))
	case strings.HasPrefix(spec, "hf:"):
		path := strings.TrimPrefix(spec, "hf:")
		if path == "" {
			return nil, errors.New(`tokenizer: "hf:" needs a path to tokenizer.json`)
		}
		return LoadHF(path)
	}
	return nil, fmt.Errorf(`tokenizer: unknown spec %q (want "byte", "gpt2", "hf" or "hf:<path>")`, spec)
}

// ByteEOS is the byte tokenizer's end-of-text id, just past the 256 bytes.
const ByteEOS = 256

type byteTokenizer struct{}

// Byte returns the byte-level tokenizer: ids 0-255 are the bytes of the
// UTF-8 text, 256 (ByteEOS) ends a text. Vocabulary 257.
func Byte() Tokenizer { return byteTokenizer{} }

func (byteTokenizer) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int(text[i])
	}
	return ids
}

func (byteTokenizer) Decode(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}

func (byteTokenizer) VocabSize() int { return 257 }
func (byteTokenizer) Name() string   { return "byte" }
func (byteTokenizer) EOS() int       { return ByteEOS }
