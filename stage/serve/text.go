package serve

import (
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// textTracker turns generated tokens into the text a client sees,
// piece by piece. It decodes the whole output each time and hands out
// what is new (right for every tokenizer: SentencePiece decoders treat a
// call's first piece differently), never hands out a tail that might
// still become a stop string or that ends inside a UTF-8 character, and
// ends the text where a stop string begins.
type textTracker struct {
	tok   tokenizer.Tokenizer
	eos   []int
	stops []string

	ids      []int
	starts   []int  // where each id's text begins in the decoded output (for logprobs)
	decoded  int    // length of the last decoding of ids
	sent     string // the text handed out so far: always a prefix of the final text
	stopped  bool   // an end-of-sequence token or a stop string ended it
	finalEnd int    // with stopped by a stop string: where the text ends
}

func newTextTracker(tok tokenizer.Tokenizer, eos []int, stops []string) *textTracker {
	return &textTracker{tok: tok, eos: eos, stops: stops, finalEnd: -1}
}

// add takes the next generated token and returns the text that may be
// handed out now; stop says generation should end.
func (t *textTracker) add(id int) (delta string, stop bool) {
	if t.stopped {
		return "", true
	}
	if slices.Contains(t.eos, id) {
		t.stopped = true
		return t.flush(), true
	}
	t.ids = append(t.ids, id)
	t.starts = append(t.starts, t.decoded)
	text := t.tok.Decode(t.ids)
	t.decoded = len(text)
	if !strings.HasPrefix(text, t.sent) {
		// The decoding of the longer sequence rewrote what was already
		// sent (a tokenizer quirk): wait until it agrees again.
		return "", false
	}
	if i := t.firstStop(text); i >= 0 {
		t.stopped = true
		end := max(i, len(t.sent))
		delta = text[len(t.sent):end]
		t.sent = text[:end]
		return delta, true
	}
	end := len(text) - t.holdBack(text)
	if end <= len(t.sent) {
		return "", false
	}
	delta = text[len(t.sent):end]
	t.sent = text[:end]
	return delta, false
}

// flush returns whatever was held back, at the end of generation.
func (t *textTracker) flush() string {
	if len(t.ids) == 0 {
		return ""
	}
	text := t.tok.Decode(t.ids)
	if !strings.HasPrefix(text, t.sent) {
		return ""
	}
	end := len(text)
	if i := t.firstStop(text); i >= 0 {
		end = max(i, len(t.sent))
	}
	delta := text[len(t.sent):end]
	t.sent = text[:end]
	return delta
}

// text is the output so far (after flush: all of it).
func (t *textTracker) text() string { return t.sent }

// covered is how many of the generated ids begin inside the text handed
// out so far: the ids whose logprobs belong with it. Once all of the text
// is out (no stop string cut it), that is every id, those that decode to
// nothing at the end included.
func (t *textTracker) covered() int {
	if len(t.sent) == t.decoded {
		return len(t.starts)
	}
	n := 0
	for n < len(t.starts) && t.starts[n] < len(t.sent) {
		n++
	}
	return n
}

// firstStop returns where the earliest stop string begins in text, or -1.
// Only the part that could hold a new occurrence is searched.
func (t *textTracker) firstStop(text string) int {
	best := -1
	for _, s := range t.stops {
		from := max(0, len(t.sent)-len(s)+1)
		if i := strings.Index(text[from:], s); i >= 0 && (best < 0 || from+i < best) {
			best = from + i
		}
	}
	return best
}

// holdBack is how many bytes at the end of text must wait: the longest
// tail that begins a stop string, and a character cut short.
func (t *textTracker) holdBack(text string) int {
	hold := 0
	for _, s := range t.stops {
		for k := min(len(s)-1, len(text)); k > hold; k-- {
			if strings.HasSuffix(text, s[:k]) {
				hold = k
				break
			}
		}
	}
	// An incomplete UTF-8 sequence at the end: its first byte is within
	// the last UTF-8 maximum length.
	for k := 1; k <= min(utf8.UTFMax-1, len(text)); k++ {
		c := text[len(text)-k]
		if utf8.RuneStart(c) {
			if !utf8.FullRuneInString(text[len(text)-k:]) {
				hold = max(hold, k)
			}
			break
		}
	}
	return hold
}
