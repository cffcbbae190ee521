package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// The parts of a tokenizer.json pipeline: normalizers rewrite a text
// segment, pre-tokenizers cut it into words, decoders turn tokens back
// into text. Each is built from its JSON object by type; a type this
// package does not know is an ErrUnsupported naming it.

type typed struct {
	Type string `json:"type"`
}

// pattern is {"String": "..."} or {"Regex": "..."}.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// regexTimeout bounds one regex match. tokenizer.json patterns come from
// the user's checkpoint and run on a backtracking engine (they need
// look-ahead), so a pathological pattern must not hang a stage.
const regexTimeout = 2 * time.Second

// matcher finds the non-empty matches of a pattern, as byte ranges.
type matcher interface {
	find(s string) [][2]int
}

type literalMatcher string

func (m literalMatcher) find(s string) [][2]int {
	var out [][2]int
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], string(m))
		if j < 0 {
			break
		}
		out = append(out, [2]int{i + j, i + j + len(m)})
		i += j + len(m)
	}
	return out
}

type regexMatcher struct{ re *regexp2.Regexp }

func (m regexMatcher) find(s string) [][2]int {
	var out [][2]int
	match, err := m.re.FindStringMatch(s)
	for match != nil && err == nil {
		if i, n := match.ByteRange(); n > 0 {
			out = append(out, [2]int{i, i + n})
		}
		match, err = m.re.FindNextMatch(match)
	}
	// On a timeout the rest of s stays unsplit: the encoding degrades,
	// but stays a valid encoding of the text.
	return out
}

// funcMatcher matches every single rune for which f holds.
type funcMatcher func(rune) bool

func (f funcMatcher) find(s string) [][2]int {
	var out [][2]int
	for i, r := range s {
		if f(r) {
			out = append(out, [2]int{i, i + utf8.RuneLen(r)})
		}
	}
	return out
}

func compilePattern(p pattern, where string) (matcher, error) {
	switch {
	case p.String != nil && p.Regex == nil:
		if *p.String == "" {
			return nil, fmt.Errorf("tokenizer: %s: empty pattern", where)
		}
		return literalMatcher(*p.String), nil
	case p.Regex != nil && p.String == nil:
		re, err := regexp2.Compile(*p.Regex, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: regex %q: %w", where, *p.Regex, err)
		}
		re.MatchTimeout = regexTimeout
		return regexMatcher{re}, nil
	}
	return nil, fmt.Errorf("tokenizer: %s: pattern needs exactly one of String or Regex", where)
}

// --- normalizers ---

type normalizer interface {
	normalize(s string) string
}

type normSequence []normalizer

func (n normSequence) normalize(s string) string {
	for _, x := range n {
		s = x.normalize(s)
	}
	return s
}

type normPrepend string

func (n normPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return string(n) + s
}

type normReplace struct {
	m       matcher
	content string
}

func (n normReplace) normalize(s string) string { return replaceMatches(s, n.m, n.content) }

func replaceMatches(s string, m matcher, content string) string {
	matches := m.find(s)
	if len(matches) == 0 {
		return s
	}
	var sb strings.Builder
	prev := 0
	for _, r := range matches {
		sb.WriteString(s[prev:r[0]])
		sb.WriteString(content)
		prev = r[1]
	}
	sb.WriteString(s[prev:])
	return sb.String()
}

type normFunc func(string) string

func (f normFunc) normalize(s string) string { return f(s) }

func buildNormalizer(raw json.RawMessage) (normalizer, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: normalizer: %w", err)
	}
	switch t.Type {
	case "Sequence":
		var v struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: normalizer Sequence: %w", err)
		}
		seq := make(normSequence, 0, len(v.Normalizers))
		for _, r := range v.Normalizers {
			n, err := buildNormalizer(r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, n)
		}
		return seq, nil
	case "Prepend":
		var v struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: normalizer Prepend: %w", err)
		}
		return normPrepend(v.Prepend), nil
	case "Replace":
		var v struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: normalizer Replace: %w", err)
		}
		m, err := compilePattern(v.Pattern, "normalizer Replace")
		if err != nil {
			return nil, err
		}
		return normReplace{m, v.Content}, nil
	case "NFC":
		return normFunc(norm.NFC.String), nil
	case "NFD":
		return normFunc(norm.NFD.String), nil
	case "NFKC":
		return normFunc(norm.NFKC.String), nil
	case "NFKD":
		return normFunc(norm.NFKD.String), nil
	case "Lowercase":
		return normFunc(strings.ToLower), nil
	case "Strip":
		var v struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: normalizer Strip: %w", err)
		}
		return normFunc(func(s string) string {
			if v.Left {
				s = strings.TrimLeftFunc(s, unicode.IsSpace)
			}
			if v.Right {
				s = strings.TrimRightFunc(s, unicode.IsSpace)
			}
			return s
		}), nil
	}
	return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, t.Type)
}

// --- pre-tokenizers ---

// piece is a word being cut; atStart marks the one that begins the input,
// which Metaspace's "first" scheme treats specially.
type piece struct {
	text    string
	atStart bool
}

type preTokenizer interface {
	split(in []piece) []piece
}

type preSequence []preTokenizer

func (p preSequence) split(in []piece) []piece {
	for _, x := range p {
		in = x.split(in)
	}
	return in
}

// splitBehavior says what happens to a match when a piece is cut, as in
// Hugging Face's SplitDelimiterBehavior.
type splitBehavior int

const (
	removed splitBehavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]splitBehavior{
	"Removed": removed, "Isolated": isolated, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

type preSplit struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (p preSplit) split(in []piece) []piece {
	var out []piece
	for _, pc := range in {
		for i, s := range cut(pc.text, p.m.find(pc.text), p.behavior, p.invert) {
			out = append(out, piece{text: s, atStart: pc.atStart && i == 0 && strings.HasPrefix(pc.text, s)})
		}
	}
	return out
}

type span struct {
	a, b  int
	match bool
}

// cut splits s around matches according to behavior; empty pieces drop.
func cut(s string, matches [][2]int, behavior splitBehavior, invert bool) []string {
	var spans []span
	prev := 0
	for _, m := range matches {
		if m[0] > prev {
			spans = append(spans, span{prev, m[0], invert})
		}
		spans = append(spans, span{m[0], m[1], !invert})
		prev = m[1]
	}
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), invert})
	}
	var out []span
	switch behavior {
	case removed:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, sp)
			}
		}
	case isolated:
		out = spans
	case mergedWithPrevious:
		prevMatch := false
		for _, sp := range spans {
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].b = sp.b
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
	case mergedWithNext:
		prevMatch := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].a = sp.a
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case contiguous:
		for i, sp := range spans {
			if i > 0 && sp.match == spans[i-1].match {
				out[len(out)-1].b = sp.b
			} else {
				out = append(out, sp)
			}
		}
	}
	strs := make([]string, 0, len(out))
	for _, sp := range out {
		if sp.b > sp.a {
			strs = append(strs, s[sp.a:sp.b])
		}
	}
	return strs
}

// gpt2Pattern is the split GPT-2's ByteLevel pre-tokenizer applies when
// use_regex is set.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

var gpt2Split = func() matcher {
	re := regexp2.MustCompile(gpt2Pattern, regexp2.None)
	re.MatchTimeout = regexTimeout
	return regexMatcher{re}
}()

type preByteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

func (p preByteLevel) split(in []piece) []piece {
	var out []piece
	for _, pc := range in {
		s := pc.text
		if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
			s = " " + s
		}
		words := []string{s}
		if p.useRegex {
			words = cut(s, gpt2Split.find(s), isolated, false)
		}
		for i, w := range words {
			out = append(out, piece{text: toByteLevel(w), atStart: pc.atStart && i == 0})
		}
	}
	return out
}

type preMetaspace struct {
	replacement string
	prepend     string // "always", "first" or "never"
	splitWords  bool
}

func (p preMetaspace) split(in []piece) []piece {
	var out []piece
	for _, pc := range in {
		s := strings.ReplaceAll(pc.text, " ", p.replacement)
		if (p.prepend == "always" || (p.prepend == "first" && pc.atStart)) && !strings.HasPrefix(s, p.replacement) {
			s = p.replacement + s
		}
		if !p.splitWords {
			out = append(out, piece{text: s, atStart: pc.atStart})
			continue
		}
		for i, w := range cut(s, literalMatcher(p.replacement).find(s), mergedWithNext, false) {
			out = append(out, piece{text: w, atStart: pc.atStart && i == 0})
		}
	}
	return out
}

func isASCIIDigit(r rune) bool { return r >= '0' && r <= '9' }

func buildPreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: pre_tokenizer: %w", err)
	}
	switch t.Type {
	case "Sequence":
		var v struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer Sequence: %w", err)
		}
		seq := make(preSequence, 0, len(v.PreTokenizers))
		for _, r := range v.PreTokenizers {
			p, err := buildPreTokenizer(r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, p)
		}
		return seq, nil
	case "ByteLevel":
		v := struct {
			AddPrefixSpace bool `json:"add_prefix_space"`
			UseRegex       bool `json:"use_regex"`
		}{UseRegex: true}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer ByteLevel: %w", err)
		}
		return preByteLevel{addPrefixSpace: v.AddPrefixSpace, useRegex: v.UseRegex}, nil
	case "Split":
		var v struct {
			Pattern  pattern `json:"pattern"`
			Behavior string  `json:"behavior"`
			Invert   bool    `json:"invert"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer Split: %w", err)
		}
		b, ok := behaviors[v.Behavior]
		if !ok {
			return nil, fmt.Errorf("%w: pre_tokenizer Split behavior %q", ErrUnsupported, v.Behavior)
		}
		m, err := compilePattern(v.Pattern, "pre_tokenizer Split")
		if err != nil {
			return nil, err
		}
		return preSplit{m: m, behavior: b, invert: v.Invert}, nil
	case "Digits":
		var v struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer Digits: %w", err)
		}
		b := contiguous
		if v.Individual {
			b = isolated
		}
		return preSplit{m: funcMatcher(isASCIIDigit), behavior: b}, nil
	case "Metaspace":
		v := struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
			Split          *bool  `json:"split"`
		}{}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer Metaspace: %w", err)
		}
		p, err := metaspaceParams(v.Replacement, v.PrependScheme, v.AddPrefixSpace, "pre_tokenizer")
		if err != nil {
			return nil, err
		}
		p.splitWords = v.Split == nil || *v.Split
		return p, nil
	case "Whitespace":
		re := regexp2.MustCompile(`\w+|[^\w\s]+`, regexp2.None)
		re.MatchTimeout = regexTimeout
		return preSplit{m: regexMatcher{re}, behavior: removed, invert: true}, nil
	case "WhitespaceSplit":
		return preSplit{m: funcMatcher(unicode.IsSpace), behavior: removed}, nil
	}
	return nil, fmt.Errorf("%w: pre_tokenizer %q", ErrUnsupported, t.Type)
}

// metaspaceParams reads Metaspace's settings in both spellings: the
// current prepend_scheme, and the older add_prefix_space boolean.
func metaspaceParams(repl, scheme string, addPrefix *bool, where string) (preMetaspace, error) {
	if repl == "" {
		repl = "▁"
	}
	if utf8.RuneCountInString(repl) != 1 {
		return preMetaspace{}, fmt.Errorf("tokenizer: %s Metaspace: replacement %q is not one character", where, repl)
	}
	switch {
	case scheme == "always" || scheme == "first" || scheme == "never":
	case scheme == "" && addPrefix != nil && !*addPrefix:
		scheme = "never"
	case scheme == "":
		scheme = "always"
	default:
		return preMetaspace{}, fmt.Errorf("%w: %s Metaspace prepend_scheme %q", ErrUnsupported, where, scheme)
	}
	return preMetaspace{replacement: repl, prepend: scheme}, nil
}

// --- decoders ---

type decoder interface {
	decode(toks []string) []string
}

type decSequence []decoder

func (d decSequence) decode(toks []string) []string {
	for _, x := range d {
		toks = x.decode(toks)
	}
	return toks
}

type decByteLevel struct{}

func (decByteLevel) decode(toks []string) []string {
	var b []byte
	for _, t := range toks {
		b = fromByteLevel(t, b)
	}
	return []string{string(b)}
}

type decReplace struct {
	from, to string
}

func (d decReplace) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = strings.ReplaceAll(t, d.from, d.to)
	}
	return out
}

// decByteFallback turns "<0xAB>" tokens into their bytes. Hugging Face
// writes U+FFFD for a run of bytes that is not valid UTF-8; this keeps the
// raw bytes, so a character split across two Decode calls comes out whole
// when the caller joins them.
type decByteFallback struct{}

func (decByteFallback) decode(toks []string) []string {
	out := make([]string, 0, len(toks))
	var run []byte
	for _, t := range toks {
		if b, ok := parseByteToken(t); ok {
			run = append(run, b)
			continue
		}
		if len(run) > 0 {
			out = append(out, string(run))
			run = run[:0]
		}
		out = append(out, t)
	}
	if len(run) > 0 {
		out = append(out, string(run))
	}
	return out
}

func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexVal(t[3])
	lo, ok2 := hexVal(t[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

type decFuse struct{}

func (decFuse) decode(toks []string) []string { return []string{strings.Join(toks, "")} }

type decStrip struct {
	content     string
	start, stop int
}

func (d decStrip) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		for n := 0; n < d.start && strings.HasPrefix(t, d.content); n++ {
			t = t[len(d.content):]
		}
		for n := 0; n < d.stop && strings.HasSuffix(t, d.content); n++ {
			t = t[:len(t)-len(d.content)]
		}
		out[i] = t
	}
	return out
}

type decMetaspace struct{ preMetaspace }

func (d decMetaspace) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		t = strings.ReplaceAll(t, d.replacement, " ")
		if i == 0 && d.prepend != "never" {
			t = strings.TrimPrefix(t, " ")
		}
		out[i] = t
	}
	return out
}

func buildDecoder(raw json.RawMessage) (decoder, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: decoder: %w", err)
	}
	switch t.Type {
	case "Sequence":
		var v struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: decoder Sequence: %w", err)
		}
		seq := make(decSequence, 0, len(v.Decoders))
		for _, r := range v.Decoders {
			d, err := buildDecoder(r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, d)
		}
		return seq, nil
	case "ByteLevel":
		return decByteLevel{}, nil
	case "Replace":
		var v struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: decoder Replace: %w", err)
		}
		if v.Pattern.String == nil || v.Pattern.Regex != nil || *v.Pattern.String == "" {
			return nil, fmt.Errorf("%w: decoder Replace needs a non-empty String pattern", ErrUnsupported)
		}
		return decReplace{from: *v.Pattern.String, to: v.Content}, nil
	case "ByteFallback":
		return decByteFallback{}, nil
	case "Fuse":
		return decFuse{}, nil
	case "Strip":
		var v struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: decoder Strip: %w", err)
		}
		if v.Content == "" || v.Start < 0 || v.Stop < 0 {
			return nil, fmt.Errorf("tokenizer: decoder Strip: content %q, start %d, stop %d", v.Content, v.Start, v.Stop)
		}
		return decStrip{content: v.Content, start: v.Start, stop: v.Stop}, nil
	case "Metaspace":
		var v struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("tokenizer: decoder Metaspace: %w", err)
		}
		p, err := metaspaceParams(v.Replacement, v.PrependScheme, v.AddPrefixSpace, "decoder")
		if err != nil {
			return nil, err
		}
		return decMetaspace{p}, nil
	}
	return nil, fmt.Errorf("%w: decoder %q", ErrUnsupported, t.Type)
}
