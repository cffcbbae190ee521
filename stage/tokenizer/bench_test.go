package tokenizer

import (
	"strings"
	"testing"
)

// benchText is English-like prose with digits and punctuation, repeated.
var benchText = strings.Repeat("The quick brown fox jumps over the lazy dog; hello world, 1234 times. ", 1500)

func benchEncode(b *testing.B, tok Tokenizer) {
	b.SetBytes(int64(len(benchText)))
	for b.Loop() {
		tok.Encode(benchText)
	}
}

func BenchmarkEncodeByte(b *testing.B) { benchEncode(b, Byte()) }

func BenchmarkEncodeGPT2(b *testing.B) {
	tok, err := GPT2()
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, tok)
}

func BenchmarkEncodeHFByteLevel(b *testing.B) {
	tok, err := LoadHF("testdata/bytelevel_tokenizer.json")
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, tok)
}

// The SentencePiece fixture has no pre-tokenizer, so the whole ~100 KB
// text is one word: this measures the O(n log n) merge on long inputs.
func BenchmarkEncodeHFSentencePiece(b *testing.B) {
	tok, err := LoadHF("testdata/sentencepiece_tokenizer.json")
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, tok)
}
