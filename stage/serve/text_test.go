package serve

import (
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// feed runs text through a tracker byte by byte (byte tokenizer) and
// returns the pieces handed out, the final text and whether it stopped.
func feed(text string, stops []string, eos bool) (pieces []string, final string, stopped bool) {
	tr := newTextTracker(tokenizer.Byte(), []int{tokenizer.ByteEOS}, stops)
	ids := tokenizer.Byte().Encode(text)
	if eos {
		ids = append(ids, tokenizer.ByteEOS)
	}
	for _, id := range ids {
		d, stop := tr.add(id)
		if d != "" {
			pieces = append(pieces, d)
		}
		if stop {
			break
		}
	}
	if d := tr.flush(); d != "" {
		pieces = append(pieces, d)
	}
	return pieces, tr.text(), tr.stopped
}

func TestTextTracker(t *testing.T) {
	cases := []struct {
		name, text string
		stops      []string
		eos        bool
		final      string
		stopped    bool
	}{
		{"plain", "hello world", nil, false, "hello world", false},
		{"eos", "hi", nil, true, "hi", true},
		{"stop across tokens", "one\nuser: two", []string{"\nuser:"}, false, "one", true},
		{"earliest stop wins", "abXYcdZ", []string{"Z", "XY"}, false, "ab", true},
		{"prefix of a stop that is not one", "a\nusual", []string{"\nuser:"}, false, "a\nusual", false},
		{"stop at the start", "STOPrest", []string{"STOP"}, false, "", true},
		{"multibyte", "héllo ✓", nil, false, "héllo ✓", false},
	}
	for _, tc := range cases {
		pieces, final, stopped := feed(tc.text, tc.stops, tc.eos)
		if final != tc.final || stopped != tc.stopped {
			t.Errorf("%s: %q stopped %v, want %q %v", tc.name, final, stopped, tc.final, tc.stopped)
		}
		if strings.Join(pieces, "") != final {
			t.Errorf("%s: pieces %q do not add up to %q", tc.name, pieces, final)
		}
		for _, p := range pieces {
			for _, s := range tc.stops {
				if strings.Contains(p, s) {
					t.Errorf("%s: piece %q holds stop %q", tc.name, p, s)
				}
			}
			if !strings.HasSuffix(p, "\xff") && !isValidUTF8(p) {
				t.Errorf("%s: piece %q splits a character", tc.name, p)
			}
		}
	}
}

func isValidUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestSamplerGreedyAndSeeded(t *testing.T) {
	logits := []float32{1, 3, 3, -2}
	if got := NewSampler(Sampling{}).Pick(logits); got != 1 {
		t.Fatalf("greedy picked %d; a tie goes to the lowest id", got)
	}
	draw := func(seed uint64, topP float64) []int32 {
		s := NewSampler(Sampling{Temperature: 1, TopP: topP, Seed: seed})
		var out []int32
		for range 200 {
			out = append(out, s.Pick(logits))
		}
		return out
	}
	a, b := draw(7, 1), draw(7, 1)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("the same seed drew differently")
		}
	}
	seen := map[int32]int{}
	for _, v := range draw(8, 1) {
		seen[v]++
	}
	if len(seen) < 3 {
		t.Fatalf("temperature 1 over 200 draws reached only %v", seen)
	}
	for _, v := range draw(9, 0.5) {
		if v != 1 && v != 2 {
			t.Fatalf("top_p 0.5 drew %d outside the nucleus {1, 2}", v)
		}
	}
}

func byteTok() tokenizer.Tokenizer { return tokenizer.Byte() }

// TestTrackerCoversSilentTokens: ids that decode to no text (here above
// the byte range) still carry logprobs once everything before them is
// out; they used to be dropped from the end of a stream.
func TestTrackerCoversSilentTokens(t *testing.T) {
	tr := newTextTracker(tokenizer.Byte(), []int{tokenizer.ByteEOS}, nil)
	for _, id := range []int{'a', 300, 'b', 301, 302} {
		tr.add(id)
	}
	if got := tr.covered(); got != 5 {
		t.Fatalf("covered %d of 5 ids before the flush", got)
	}
	tr.flush()
	if got := tr.covered(); got != 5 {
		t.Fatalf("covered %d of 5 ids after the flush", got)
	}
	cut := newTextTracker(tokenizer.Byte(), nil, []string{"XY"})
	for _, id := range []int{'a', 'X', 'Y', 'c'} {
		cut.add(id)
	}
	cut.flush()
	if got := cut.covered(); got != 1 {
		t.Fatalf("a stop string cut after 1 id, covered %d", got)
	}
}
