package tokenizer

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestByte(t *testing.T) {
	tok := Byte()
	if tok.VocabSize() != 257 || tok.EOS() != 256 || tok.Name() != "byte" {
		t.Fatalf("byte tokenizer: vocab %d eos %d name %q", tok.VocabSize(), tok.EOS(), tok.Name())
	}
	s := "héllo\x00\xff"
	ids := tok.Encode(s)
	if !slices.Equal(ids, []int{'h', 0xc3, 0xa9, 'l', 'l', 'o', 0, 0xff}) {
		t.Errorf("Encode = %v", ids)
	}
	if got := tok.Decode(append(ids, ByteEOS, -1, 9999)); got != s {
		t.Errorf("Decode = %q, want %q", got, s)
	}
	if BOS(tok) != -1 {
		t.Error("byte tokenizer has a BOS")
	}
}

func TestGPT2(t *testing.T) {
	tok, err := GPT2()
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 50257 || tok.EOS() != 50256 || tok.Name() != "gpt2" {
		t.Fatalf("gpt2: vocab %d eos %d name %q", tok.VocabSize(), tok.EOS(), tok.Name())
	}
	// Ids from GPT-2's published encoder: "Hello"=15496, " world"=995, ","=11.
	if got := tok.Encode("Hello world,"); !slices.Equal(got, []int{15496, 995, 11}) {
		t.Errorf("Encode = %v", got)
	}
	ids := tok.Encode("end.<|endoftext|>Next")
	if !slices.Contains(ids, 50256) {
		t.Errorf("EOS text not encoded as 50256: %v", ids)
	}
	for _, s := range []string{"end.<|endoftext|>Next", "Ünïcödé ✓ 🙂 text\n\twith  spaces", "<|endoftext|>"} {
		if got := tok.Decode(tok.Encode(s)); got != s {
			t.Errorf("round trip %q -> %q", s, got)
		}
	}
	if got := tok.Decode([]int{15496, -3, 70000, 995}); got != "Hello world" {
		t.Errorf("out-of-range ids not skipped: %q", got)
	}
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	fixture, _ := os.ReadFile("testdata/bytelevel_tokenizer.json")
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), fixture, 0o644)
	for spec, name := range map[string]string{
		"byte": "byte", "gpt2": "gpt2", "hf": "hf:" + filepath.Join(dir, "tokenizer.json"),
		"hf:testdata/sentencepiece_tokenizer.json": "hf:testdata/sentencepiece_tokenizer.json",
	} {
		tok, err := New(spec, dir)
		if err != nil {
			t.Fatalf("New(%q): %v", spec, err)
		}
		if tok.Name() != name {
			t.Errorf("New(%q).Name() = %q, want %q", spec, tok.Name(), name)
		}
	}
	for _, spec := range []string{"", "bpe", "hf:"} {
		if _, err := New(spec, dir); err == nil {
			t.Errorf("New(%q) accepted", spec)
		}
	}
	if _, err := New("hf", ""); err == nil {
		t.Error(`New("hf", "") accepted`)
	}
	if _, err := New("hf", t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing tokenizer.json: %v", err)
	}
}

func loadFixture(t *testing.T, name string) *hfTokenizer {
	t.Helper()
	tok, err := LoadHF(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return tok.(*hfTokenizer)
}

// The expected ids below follow from the fixtures by hand: the byte-level
// fixture has its three specials at 0-2, byte b at 3+b, then one token per
// merge in merge order (Ġt=259, he=260, Ġthe=261, ll=262, hell=263,
// hello=264, Ġw=265, or=266, Ġwor=267, ld=268, Ġworld=269, Ġh=270).
func TestByteLevelBPE(t *testing.T) {
	tok := loadFixture(t, "bytelevel_tokenizer.json")
	if tok.VocabSize() != 271 || tok.EOS() != 0 || tok.BOS() != -1 {
		t.Fatalf("vocab %d eos %d bos %d", tok.VocabSize(), tok.EOS(), tok.BOS())
	}
	cases := []struct {
		text string
		ids  []int
	}{
		// he (rank 1) goes before ll (3), then hell, hello.
		{"hello", []int{264}},
		{"hello world", []int{264, 269}},
		// " hello": Ġh (rank 11) loses to he (1); Ġ and hello never merge.
		{" hello", []int{3 + ' ', 264}},
		{"the", []int{3 + 't', 260}},
		{" the", []int{261}},
		// Digits are isolated before the byte-level split; the space stays
		// its own word.
		{"abc 123", []int{3 + 'a', 3 + 'b', 3 + 'c', 3 + ' ', 3 + '1', 3 + '2', 3 + '3'}},
		// é is bytes C3 A9; \n is byte 10.
		{"é\n", []int{3 + 0xc3, 3 + 0xa9, 3 + '\n'}},
		{"<|im_start|>hello<|im_end|>", []int{1, 264, 2}},
		{"a<|endoftext|>b", []int{3 + 'a', 0, 3 + 'b'}},
	}
	for _, c := range cases {
		if got := tok.Encode(c.text); !slices.Equal(got, c.ids) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.ids)
		}
		if got := tok.Decode(c.ids); got != c.text {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.text)
		}
	}
	roundTrips(t, tok)
}

// The SentencePiece-style fixture has <unk> <s> </s> at 0-2, <0xXX> at
// 3+XX, then ▁ h e l o w r d t at 259-267, then one token per merge in
// merge order (▁t=268, he=269, ▁the=270, ll=271, hell=272, hello=273,
// ▁h=274, ▁hello=275, ▁w=276, or=277, ▁wor=278, ld=279, ▁world=280).
func TestSentencePieceBPE(t *testing.T) {
	tok := loadFixture(t, "sentencepiece_tokenizer.json")
	if tok.VocabSize() != 281 || tok.EOS() != 2 || tok.BOS() != 1 || BOS(tok) != 1 {
		t.Fatalf("vocab %d eos %d bos %d", tok.VocabSize(), tok.EOS(), tok.BOS())
	}
	cases := []struct {
		text string
		ids  []int
		back string // "" means text
	}{
		// The normalizer makes "▁hello▁world", one word: hello forms
		// first, then ▁hello (rank 7) beats the stale ▁h (rank 6).
		{"hello world", []int{275, 280}, ""},
		// ▁t (rank 0), he (1), then ▁t+he (2).
		{"the", []int{270}, ""},
		// i and ! are not pieces: byte fallback.
		{"hi!", []int{274, 3 + 'i', 3 + '!'}, ""},
		{"é", []int{259, 3 + 0xc3, 3 + 0xa9}, ""},
		// The legacy normalizer prepends ▁ to the text after <s> too, and
		// the decoder keeps the space that follows the special token.
		{"<s>hello", []int{1, 275}, "<s> hello"},
	}
	for _, c := range cases {
		if got := tok.Encode(c.text); !slices.Equal(got, c.ids) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.ids)
		}
		want := c.back
		if want == "" {
			want = c.text
		}
		if got := tok.Decode(c.ids); got != want {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, want)
		}
	}
	roundTrips(t, tok)
}

// metaspaceVariant rewrites the SentencePiece fixture the way newer
// Llama conversions spell it: no normalizer, a Metaspace pre-tokenizer
// that prepends ▁ only at the start of the input, a Metaspace decoder.
func metaspaceVariant(t *testing.T, split bool) *hfTokenizer {
	raw, err := os.ReadFile("testdata/sentencepiece_tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["normalizer"] = nil
	m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": split}
	m["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{
		map[string]any{"type": "ByteFallback"},
		map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
		map[string]any{"type": "Fuse"},
	}}
	out, _ := json.Marshal(m)
	tok, err := parseHF(out, "variant")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestMetaspacePreTokenizer(t *testing.T) {
	for _, split := range []bool{false, true} {
		tok := metaspaceVariant(t, split)
		if got := tok.Encode("hello world"); !slices.Equal(got, []int{275, 280}) {
			t.Errorf("split=%v: Encode = %v", split, got)
		}
		// "first": no ▁ after a special token, so plain "hello".
		if got := tok.Encode("<s>hello"); !slices.Equal(got, []int{1, 273}) {
			t.Errorf("split=%v: Encode(<s>hello) = %v", split, got)
		}
		if got := tok.Decode([]int{275, 280}); got != "hello world" {
			t.Errorf("split=%v: Decode = %q", split, got)
		}
		roundTrips(t, tok)
	}
}

func TestTokenizerConfigSetsSpecials(t *testing.T) {
	dir := t.TempDir()
	fixture, _ := os.ReadFile("testdata/bytelevel_tokenizer.json")
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), fixture, 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"bos_token":"<|im_start|>","eos_token":{"content":"<|im_end|>","special":true}}`), 0o644)
	tok, err := LoadHF(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if tok.EOS() != 2 || BOS(tok) != 1 {
		t.Errorf("eos %d bos %d, want 2 and 1", tok.EOS(), BOS(tok))
	}
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token":"<nope>"}`), 0o644)
	if _, err := LoadHF(filepath.Join(dir, "tokenizer.json")); err == nil || !strings.Contains(err.Error(), "<nope>") {
		t.Errorf("unknown eos_token: %v", err)
	}
}

func TestUnkAndFuse(t *testing.T) {
	js := `{"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":%s,"vocab":{"<unk>":0,"a":1,"b":2,"ab":3},"merges":["a b"]},
		"decoder":{"type":"Fuse"}}`
	for fuse, want := range map[string][]int{"true": {3, 0, 1}, "false": {3, 0, 0, 1}} {
		tok, err := parseHF([]byte(strings.Replace(js, "%s", fuse, 1)), "unk")
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode("abxya"); !slices.Equal(got, want) {
			t.Errorf("fuse_unk=%s: Encode = %v, want %v", fuse, got, want)
		}
	}
}

func TestSplitBehaviors(t *testing.T) {
	m := literalMatcher("-")
	s := "a-b--c-"
	want := map[splitBehavior][]string{
		removed:            {"a", "b", "c"},
		isolated:           {"a", "-", "b", "-", "-", "c", "-"},
		mergedWithPrevious: {"a-", "b-", "-", "c-"},
		mergedWithNext:     {"a", "-b", "-", "-c", "-"},
		contiguous:         {"a", "-", "b", "--", "c", "-"},
	}
	for b, w := range want {
		if got := cut(s, m.find(s), b, false); !slices.Equal(got, w) {
			t.Errorf("behavior %d: %q, want %q", b, got, w)
		}
	}
	if got := cut(s, m.find(s), removed, true); !slices.Equal(got, []string{"-", "-", "-", "-"}) {
		t.Errorf("inverted Removed: %q", got)
	}
}

// roundTrips checks Decode(Encode(s)) == s on random text mixing ASCII,
// fixture words, accents, emoji and control bytes, and that decoding id by
// id and concatenating gives the same bytes (streaming generation).
func roundTrips(t *testing.T, tok Tokenizer) {
	t.Helper()
	rng := rand.New(rand.NewPCG(11, 12))
	parts := []string{"hello", " world", "the", " ", "  ", "\n", "é", "ü", "🙂", "中文", "123", "!?", "\t", "x"}
	for range 300 {
		var sb strings.Builder
		for range 1 + rng.IntN(12) {
			sb.WriteString(parts[rng.IntN(len(parts))])
		}
		s := sb.String()
		ids := tok.Encode(s)
		got := tok.Decode(ids)
		// A SentencePiece decoder strips the ▁ it added, so a leading
		// space it cannot tell from that ▁ is lost, as in HF itself.
		if got != s && !(strings.HasPrefix(s, " ") && got == s[1:] && tok.(*hfTokenizer).model.byteFallback) {
			t.Fatalf("%s: round trip %q -> %v -> %q", tok.Name(), s, ids, got)
		}
		if !tok.(*hfTokenizer).model.byteFallback {
			var pieces strings.Builder
			for _, id := range ids {
				pieces.WriteString(tok.Decode([]int{id}))
			}
			if pieces.String() != got {
				t.Fatalf("%s: piecewise decode %q != %q", tok.Name(), pieces.String(), got)
			}
		}
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d outside vocab %d", id, tok.VocabSize())
			}
		}
	}
}

func TestLoadHFRefusals(t *testing.T) {
	base := `{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`
	if _, err := parseHF([]byte(base), "ok"); err != nil {
		t.Fatalf("base fixture refused: %v", err)
	}
	cases := map[string]struct {
		js      string
		unsup   bool
		mention string
	}{
		"not json":           {`{"model":`, false, "tokenizer.json"},
		"no model":           {`{"added_tokens":[]}`, false, "no model"},
		"unigram":            {`{"model":{"type":"Unigram","vocab":[["a",0.0]]}}`, true, "Unigram"},
		"wordpiece":          {`{"model":{"type":"WordPiece","vocab":{"a":0}}}`, true, "WordPiece"},
		"empty vocab":        {`{"model":{"type":"BPE","vocab":{},"merges":[]}}`, false, "empty"},
		"negative id":        {`{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`, false, `"a"`},
		"huge id":            {`{"model":{"type":"BPE","vocab":{"a":2000000000},"merges":[]}}`, false, `"a"`},
		"duplicate id":       {`{"model":{"type":"BPE","vocab":{"a":0,"b":0},"merges":[]}}`, false, "id 0"},
		"merge not in vocab": {`{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}`, false, `"a" "b"`},
		"bad merge string":   {`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a"]}}`, false, "merge 0"},
		"bad merge pair":     {`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","b","c"]]}}`, false, "merge 0"},
		"unk not in vocab":   {`{"model":{"type":"BPE","unk_token":"<unk>","vocab":{"a":0},"merges":[]}}`, false, "<unk>"},
		"subword prefix":     {`{"model":{"type":"BPE","continuing_subword_prefix":"##","vocab":{"a":0},"merges":[]}}`, true, "##"},
		"added no id":        {`{"added_tokens":[{"content":"<x>"}],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, false, "<x>"},
		"added empty":        {`{"added_tokens":[{"id":1,"content":""}],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, false, "empty"},
		"added huge id":      {`{"added_tokens":[{"id":99999999,"content":"<x>"}],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, false, "<x>"},
		"added clash":        {`{"added_tokens":[{"id":1,"content":"<x>"},{"id":1,"content":"<y>"}],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, false, "share id 1"},
		"bad normalizer":     {`{"normalizer":{"type":"Precompiled"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, true, "Precompiled"},
		"bad pretokenizer":   {`{"pre_tokenizer":{"type":"BertPreTokenizer"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, true, "BertPreTokenizer"},
		"bad regex":          {`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"("},"behavior":"Isolated"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, false, "regex"},
		"bad behavior":       {`{"pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"Sideways"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, true, "Sideways"},
		"bad decoder":        {`{"decoder":{"type":"WordPiece"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, true, "WordPiece"},
		"bad scheme":         {`{"pre_tokenizer":{"type":"Metaspace","prepend_scheme":"sometimes"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, true, "sometimes"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := parseHF([]byte(c.js), "x")
			if err == nil {
				t.Fatal("accepted")
			}
			if errors.Is(err, ErrUnsupported) != c.unsup {
				t.Errorf("ErrUnsupported = %v, want %v: %v", !c.unsup, c.unsup, err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Errorf("error %q does not mention %q", err, c.mention)
			}
		})
	}
}

func TestLoadHFSizeLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// A sparse file past the limit: refused before it is parsed.
	if err := f.Truncate(MaxHFFileSize + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := LoadHF(path); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("oversized file: %v", err)
	}
}

// TestRealTokenizer runs against a real checkpoint's tokenizer.json when
// HOLOPEER_TOKENIZER_JSON points at one; none ships with the repository.
func TestRealTokenizer(t *testing.T) {
	path := os.Getenv("HOLOPEER_TOKENIZER_JSON")
	if path == "" {
		t.Skip("HOLOPEER_TOKENIZER_JSON not set")
	}
	tok, err := LoadHF(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Hello world!", "The quick brown fox jumps over 13 lazy dogs.", "Ünïcödé 🙂 中文"} {
		got := tok.Decode(tok.Encode(s))
		if got != s && got != " "+s && " "+got != s {
			t.Errorf("round trip %q -> %q", s, got)
		}
	}
}

func FuzzParseHF(f *testing.F) {
	for _, name := range []string{"bytelevel_tokenizer.json", "sentencepiece_tokenizer.json"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"vocab":{"<unk>":0,"a":1,"b":2,"ab":3},"merges":[["a","b"]]},"added_tokens":[{"id":4,"content":"<s>","lstrip":true,"rstrip":true}]}`))
	f.Add([]byte(`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s+(?!\\S)"},"behavior":"MergedWithNext","invert":true},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := parseHF(data, "fuzz")
		if err != nil {
			return
		}
		for _, s := range []string{"hello world 123", "<s>é🙂\n", ""} {
			ids := tok.Encode(s)
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("id %d outside vocab %d", id, tok.VocabSize())
				}
			}
			_ = tok.Decode(ids)
		}
		if !utf8.ValidString(tok.Name()) {
			t.Fatal("bad name")
		}
	})
}

// TestLlama3SplitPattern: the look-ahead and case-folding regex of
// Llama-3's pre-tokenizer compiles on regexp2 and splits as it does in
// Hugging Face.
func TestLlama3SplitPattern(t *testing.T) {
	const llama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	raw, _ := json.Marshal(map[string]any{"type": "Split", "pattern": map[string]string{"Regex": llama3}, "behavior": "Isolated", "invert": false})
	p, err := buildPreTokenizer(raw)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, pc := range p.split([]piece{{text: "Hello world'S 12345  ok\n\nx", atStart: true}}) {
		got = append(got, pc.text)
	}
	want := []string{"Hello", " world", "'S", " ", "123", "45", " ", " ok", "\n\n", "x"}
	if !slices.Equal(got, want) {
		t.Errorf("split %q, want %q", got, want)
	}
}
