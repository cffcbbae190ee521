package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxHFFileSize bounds a tokenizer.json. The largest common ones (Llama-3,
// Qwen, Gemma) are 7-35 MB.
const MaxHFFileSize = 64 << 20

// maxConfigSize bounds tokenizer_config.json, which holds a few special
// token names and a chat template.
const maxConfigSize = 4 << 20

// hfTokenizer is a tokenizer.json pipeline: added tokens are cut out of
// the text first, the rest is normalized, pre-tokenized into words, and
// each word is encoded by the BPE model. Decoding maps ids to tokens and
// runs the decoder chain.
type hfTokenizer struct {
	name       string
	model      *bpe
	normalizer normalizer   // nil: none
	pretok     preTokenizer // nil: the whole segment is one word
	decoder    decoder      // nil: tokens joined by spaces, as HF does
	added      addedVocab
	vocabSize  int
	bos, eos   int
}

// LoadHF reads a Hugging Face tokenizer.json. It supports BPE models with
// a byte-level pre-tokenizer and decoder (GPT-2, SmolLM2, Llama-3 style)
// and SentencePiece-style BPE with "▁" and byte fallback (Llama-2,
// TinyLlama style). BOS and EOS come from tokenizer_config.json beside it
// when present, else from the post-processor and well-known token names.
func LoadHF(path string) (Tokenizer, error) {
	data, err := readBounded(path, MaxHFFileSize)
	if err != nil {
		return nil, err
	}
	t, err := parseHF(data, "hf:"+path)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	cfgPath := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	if cfg, err := readBounded(cfgPath, maxConfigSize); err == nil {
		if err := t.applyConfig(cfg); err != nil {
			return nil, fmt.Errorf("%w (%s)", err, cfgPath)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return t, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > limit {
		return nil, fmt.Errorf("tokenizer: %s is %d bytes, over the %d-byte limit", path, st.Size(), limit)
	}
	// Also read at most one byte past the limit rather than trusting Stat, which a
	// growing file or a pipe can get wrong.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: reading %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("tokenizer: %s is larger than the %d-byte limit", path, limit)
	}
	return data, nil
}

type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type hfAddedToken struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type                    string          `json:"type"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// parseHF builds a tokenizer from tokenizer.json bytes, validating sizes,
// ids and references before building any table from them.
func parseHF(data []byte, name string) (*hfTokenizer, error) {
	if len(data) > MaxHFFileSize {
		return nil, fmt.Errorf("tokenizer: tokenizer.json is %d bytes, over the %d-byte limit", len(data), MaxHFFileSize)
	}
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	if isNull(f.Model) {
		return nil, errors.New("tokenizer: tokenizer.json has no model")
	}
	// The type first: other model types spell their vocab differently.
	var kind struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(f.Model, &kind); err != nil {
		return nil, fmt.Errorf("tokenizer: model: %w", err)
	}
	// Very old files leave out the type; a vocabulary with merges is BPE.
	if kind.Type != "BPE" && !(kind.Type == "" && kind.Merges != nil) {
		return nil, fmt.Errorf("%w: model type %q (only BPE: GPT-2, Llama, SmolLM2, TinyLlama style)", ErrUnsupported, kind.Type)
	}
	var m hfModel
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("tokenizer: model: %w", err)
	}
	t := &hfTokenizer{name: name, bos: -1, eos: -1}
	maxID, err := t.buildAdded(f.AddedTokens, len(m.Vocab))
	if err != nil {
		return nil, err
	}
	if t.model, err = buildBPE(m, len(f.AddedTokens)); err != nil {
		return nil, err
	}
	t.vocabSize = max(maxID, len(t.model.idToToken)-1) + 1
	if !isNull(f.Normalizer) {
		if t.normalizer, err = buildNormalizer(f.Normalizer); err != nil {
			return nil, err
		}
	}
	if !isNull(f.PreTokenizer) {
		if t.pretok, err = buildPreTokenizer(f.PreTokenizer); err != nil {
			return nil, err
		}
	}
	if !isNull(f.Decoder) {
		if t.decoder, err = buildDecoder(f.Decoder); err != nil {
			return nil, err
		}
	}
	t.bos = templateBOS(f.PostProcessor)
	t.guessSpecials()
	return t, nil
}

// maxIDFor lets ids leave some gaps (a few tokenizers skip ids) while
// refusing an id that would make the reverse table enormous.
func maxIDFor(entries int) int { return 2*entries + 1024 }

func buildBPE(m hfModel, added int) (*bpe, error) {
	if len(m.Vocab) == 0 {
		return nil, errors.New("tokenizer: model vocab is empty")
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return nil, fmt.Errorf("%w: BPE continuing_subword_prefix %q", ErrUnsupported, *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("%w: BPE end_of_word_suffix %q", ErrUnsupported, *m.EndOfWordSuffix)
	}
	limit := maxIDFor(len(m.Vocab) + added)
	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 || id >= limit {
			return nil, fmt.Errorf("tokenizer: vocab token %q has id %d, outside [0, %d)", tok, id, limit)
		}
		maxID = max(maxID, id)
	}
	b := &bpe{
		vocab:        m.Vocab,
		idToToken:    make([]string, maxID+1),
		merges:       make(map[uint64]mergeTarget),
		unk:          -1,
		fuseUnk:      m.FuseUnk,
		byteFallback: m.ByteFallback,
		ignoreMerges: m.IgnoreMerges,
		cache:        make(map[string][]int),
	}
	seen := make([]bool, maxID+1)
	for tok, id := range m.Vocab {
		if seen[id] {
			return nil, fmt.Errorf("tokenizer: vocab id %d used by %q and %q", id, b.idToToken[id], tok)
		}
		if tok == "" {
			return nil, fmt.Errorf("tokenizer: vocab has an empty token (id %d)", id)
		}
		seen[id] = true
		b.idToToken[id] = tok
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("tokenizer: unk_token %q is not in the vocab", *m.UnkToken)
		}
		b.unk = id
	}
	for i := range 256 {
		b.byteIDs[i] = -1
		if id, ok := m.Vocab[byteToken(byte(i))]; ok {
			b.byteIDs[i] = id
		}
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	for rank, p := range pairs {
		a, okA := m.Vocab[p[0]]
		c, okC := m.Vocab[p[1]]
		id, okM := m.Vocab[p[0]+p[1]]
		if !okA || !okC || !okM {
			return nil, fmt.Errorf("tokenizer: merge %d (%q %q) uses a token not in the vocab", rank, p[0], p[1])
		}
		// A repeated pair keeps its first (best) rank.
		if _, dup := b.merges[pairKey(a, c)]; !dup {
			b.merges[pairKey(a, c)] = mergeTarget{rank: rank, id: id}
		}
	}
	return b, nil
}

// parseMerges accepts both spellings: ["a b", ...] (older files) and
// [["a", "b"], ...] (tokenizers >= 0.20, which allows spaces in tokens).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, fmt.Errorf("tokenizer: merges: %w", err)
	}
	out := make([][2]string, len(elems))
	for i, e := range elems {
		var s string
		if err := json.Unmarshal(e, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("tokenizer: merge %d %q is not two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(e, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("tokenizer: merge %d is neither \"a b\" nor [a, b]", i)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// addedToken is a token matched in raw text before normalization.
type addedToken struct {
	id                   int
	content              string
	lstrip, rstrip, word bool
}

type addedVocab struct {
	byID    map[int]string
	byFirst map[byte][]addedToken // candidates by first byte, longest first
}

func (t *hfTokenizer) buildAdded(toks []hfAddedToken, vocabLen int) (int, error) {
	t.added = addedVocab{byID: make(map[int]string), byFirst: make(map[byte][]addedToken)}
	limit := maxIDFor(vocabLen + len(toks))
	maxID := -1
	for i, a := range toks {
		if a.ID == nil {
			return 0, fmt.Errorf("tokenizer: added token %d (%q) has no id", i, a.Content)
		}
		id := *a.ID
		if id < 0 || id >= limit {
			return 0, fmt.Errorf("tokenizer: added token %q has id %d, outside [0, %d)", a.Content, id, limit)
		}
		if a.Content == "" {
			return 0, fmt.Errorf("tokenizer: added token %d has empty content", id)
		}
		if prev, dup := t.added.byID[id]; dup && prev != a.Content {
			return 0, fmt.Errorf("tokenizer: added tokens %q and %q share id %d", prev, a.Content, id)
		}
		t.added.byID[id] = a.Content
		first := a.Content[0]
		t.added.byFirst[first] = append(t.added.byFirst[first], addedToken{id: id, content: a.Content, lstrip: a.LStrip, rstrip: a.RStrip, word: a.SingleWord})
		maxID = max(maxID, id)
	}
	for _, c := range t.added.byFirst {
		slices.SortStableFunc(c, func(a, b addedToken) int { return len(b.content) - len(a.content) })
	}
	return maxID, nil
}

// segment is a piece of the input: either an added token or text.
type segment struct {
	text    string
	added   int  // id of an added token, or -1
	atStart bool // the text begins the input
}

// splitAdded cuts added tokens out of text, leftmost first and longest
// among those starting at the same place.
func (a *addedVocab) splitAdded(text string) []segment {
	if len(a.byFirst) == 0 {
		return []segment{{text: text, added: -1, atStart: true}}
	}
	var segs []segment
	textStart := 0
	emitText := func(end int) {
		if end > textStart {
			segs = append(segs, segment{text: text[textStart:end], added: -1, atStart: textStart == 0})
		}
	}
	for i := 0; i < len(text); {
		tok, ok := a.matchAt(text, i)
		if !ok {
			i++
			continue
		}
		start, end := i, i+len(tok.content)
		if tok.lstrip {
			for start > textStart {
				r, n := utf8.DecodeLastRuneInString(text[textStart:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= n
			}
		}
		emitText(start)
		segs = append(segs, segment{added: tok.id})
		if tok.rstrip {
			for end < len(text) {
				r, n := utf8.DecodeRuneInString(text[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += n
			}
		}
		textStart, i = end, end
	}
	emitText(len(text))
	return segs
}

func (a *addedVocab) matchAt(text string, i int) (addedToken, bool) {
	for _, tok := range a.byFirst[text[i]] {
		if !strings.HasPrefix(text[i:], tok.content) {
			continue
		}
		if tok.word && (isWordRuneBefore(text, i) || isWordRuneAt(text, i+len(tok.content))) {
			continue
		}
		return tok, true
	}
	return addedToken{}, false
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func isWordRuneBefore(s string, i int) bool {
	if i == 0 {
		return false
	}
	r, _ := utf8.DecodeLastRuneInString(s[:i])
	return isWordRune(r)
}

func isWordRuneAt(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	r, _ := utf8.DecodeRuneInString(s[i:])
	return isWordRune(r)
}

func (t *hfTokenizer) Encode(text string) []int {
	var ids []int
	for _, seg := range t.added.splitAdded(text) {
		if seg.added >= 0 {
			ids = append(ids, seg.added)
			continue
		}
		s := seg.text
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		pieces := []piece{{text: s, atStart: seg.atStart}}
		if t.pretok != nil {
			pieces = t.pretok.split(pieces)
		}
		for _, p := range pieces {
			ids = t.model.encodeWord(p.text, ids)
		}
	}
	return ids
}

func (t *hfTokenizer) token(id int) (string, bool) {
	if s, ok := t.added.byID[id]; ok {
		return s, true
	}
	if id >= 0 && id < len(t.model.idToToken) && t.model.idToToken[id] != "" {
		return t.model.idToToken[id], true
	}
	return "", false
}

func (t *hfTokenizer) Decode(ids []int) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if s, ok := t.token(id); ok {
			toks = append(toks, s)
		}
	}
	if t.decoder == nil {
		return strings.Join(toks, " ")
	}
	return strings.Join(t.decoder.decode(toks), "")
}

func (t *hfTokenizer) VocabSize() int { return t.vocabSize }
func (t *hfTokenizer) Name() string   { return t.name }
func (t *hfTokenizer) EOS() int       { return t.eos }
func (t *hfTokenizer) BOS() int       { return t.bos }

// id finds a token by its text, added tokens first.
func (t *hfTokenizer) id(content string) (int, bool) {
	for _, c := range t.added.byFirst[firstByte(content)] {
		if c.content == content {
			return c.id, true
		}
	}
	id, ok := t.model.vocab[content]
	return id, ok
}

func firstByte(s string) byte {
	if s == "" {
		return 0
	}
	return s[0]
}

// Well-known end and start markers, most common first, for files that come
// without a tokenizer_config.json.
var (
	eosNames = []string{"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>", "<|eot_id|>"}
	bosNames = []string{"<s>", "<|begin_of_text|>", "<bos>"}
)

func (t *hfTokenizer) guessSpecials() {
	for _, n := range eosNames {
		if id, ok := t.id(n); ok && t.eos < 0 {
			t.eos = id
		}
	}
	for _, n := range bosNames {
		if id, ok := t.id(n); ok && t.bos < 0 {
			t.bos = id
		}
	}
}

// templateBOS reads the BOS a TemplateProcessing post-processor puts in
// front of a single sequence (Llama's "<s>" or "<|begin_of_text|>").
func templateBOS(raw json.RawMessage) int {
	if isNull(raw) {
		return -1
	}
	var p struct {
		Type   string `json:"type"`
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
	}
	if json.Unmarshal(raw, &p) != nil || p.Type != "TemplateProcessing" || len(p.Single) == 0 || p.Single[0].SpecialToken == nil {
		return -1
	}
	if st, ok := p.SpecialTokens[p.Single[0].SpecialToken.ID]; ok && len(st.IDs) == 1 && st.IDs[0] >= 0 {
		return st.IDs[0]
	}
	return -1
}

// applyConfig takes bos_token and eos_token from tokenizer_config.json,
// where each is a string or an object with "content".
func (t *hfTokenizer) applyConfig(data []byte) error {
	var cfg struct {
		BOS json.RawMessage `json:"bos_token"`
		EOS json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
	}
	for _, f := range []struct {
		raw  json.RawMessage
		dst  *int
		name string
	}{{cfg.BOS, &t.bos, "bos_token"}, {cfg.EOS, &t.eos, "eos_token"}} {
		if isNull(f.raw) {
			continue
		}
		var s string
		if json.Unmarshal(f.raw, &s) != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(f.raw, &obj); err != nil {
				return fmt.Errorf("tokenizer: tokenizer_config.json %s: %w", f.name, err)
			}
			s = obj.Content
		}
		id, ok := t.id(s)
		if !ok {
			return fmt.Errorf("tokenizer: tokenizer_config.json %s %q is not a token", f.name, s)
		}
		*f.dst = id
	}
	return nil
}
