package data

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// counting returns a corpus whose token i is i, so a window's first input
// names its start.
func counting(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

func TestTextWindowsCoverAnEpoch(t *testing.T) {
	const n, seqLen = 1000, 10
	src, err := NewTokens(counting(n), n, 42)
	if err != nil {
		t.Fatal(err)
	}
	in, tg, err := src.Next(1, seqLen)
	if err != nil {
		t.Fatal(err)
	}
	starts := []int32{in[0]}
	windows := len(src.order)
	// The epoch's windows, one batch at a time.
	for len(starts) < windows {
		in, tg, err = src.Next(1, seqLen)
		if err != nil {
			t.Fatal(err)
		}
		for i := range seqLen {
			if in[i] != in[0]+int32(i) || tg[i] != in[i]+1 {
				t.Fatalf("window %v / %v is not contiguous or not shifted", in, tg)
			}
		}
		starts = append(starts, in[0])
	}
	offset := slices.Min(starts)
	if offset >= seqLen {
		t.Errorf("offset %d not below seqLen", offset)
	}
	slices.Sort(starts)
	for i, s := range starts {
		if s != offset+int32(i*seqLen) {
			t.Fatalf("epoch starts %v are not every %d tokens from %d", starts, seqLen, offset)
		}
	}
	if last := int(starts[len(starts)-1]) + seqLen + 1; last > n || n-last >= seqLen {
		t.Errorf("epoch leaves %d tokens unused", n-last)
	}
	// The next batch starts a new epoch with a new order.
	first := src.State()
	src.Next(1, seqLen)
	if st := src.State(); st.Epoch != first.Epoch+1 || st.Cursor != 1 {
		t.Errorf("after an epoch: %+v", st)
	}
}

func TestTextDeterministicAndReshuffled(t *testing.T) {
	draw := func(seed uint64, batches int) []int32 {
		src, _ := NewTokens(counting(500), 500, seed)
		var all []int32
		for range batches {
			in, _, err := src.Next(3, 7)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, in...)
		}
		return all
	}
	if !slices.Equal(draw(1, 40), draw(1, 40)) {
		t.Error("same seed, different windows")
	}
	if slices.Equal(draw(1, 40), draw(2, 40)) {
		t.Error("different seeds, same windows")
	}
	// 500 tokens make about 71 windows of 7: epochs 0 and 1 order them
	// differently.
	src, _ := NewTokens(counting(500), 500, 1)
	var e0, e1 []int32
	for src.State().Epoch == 0 || src.State().Cursor < len(src.order) {
		in, _, _ := src.Next(1, 7)
		if src.State().Epoch == 0 {
			e0 = append(e0, in[0])
		} else {
			e1 = append(e1, in[0])
		}
	}
	if slices.Equal(e0[:10], e1[:10]) {
		t.Error("epoch 1 repeats epoch 0's order")
	}
}

func TestTextStateRestore(t *testing.T) {
	a, _ := NewTokens(counting(3000), 3000, 9)
	for range 17 {
		a.Next(4, 16)
	}
	st := a.State()
	want, _, _ := a.Next(64, 16) // crosses into the next epoch
	b, _ := NewTokens(counting(3000), 3000, 9)
	if err := b.Restore(st); err != nil {
		t.Fatal(err)
	}
	got, _, _ := b.Next(64, 16)
	if !slices.Equal(got, want) {
		t.Error("restored source serves different windows")
	}
	if err := b.Restore(TextState{SeqLen: 16, Epoch: 0, Cursor: 1 << 20}); err == nil {
		t.Error("cursor past the epoch accepted")
	}
	if err := b.Restore(TextState{SeqLen: 5000, Epoch: 0}); err == nil {
		t.Error("window longer than the corpus accepted")
	}
}

func TestTextFileAndDirectory(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "b.txt"), []byte("second doc"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("first doc"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.json"), []byte(`{"ignored":true}`), 0o644)
	src, err := NewTextFile(dir, tokenizer.Byte(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want := append(tokenizer.Byte().Encode("first doc"), tokenizer.ByteEOS)
	want = append(want, tokenizer.Byte().Encode("second doc")...)
	got := make([]int, src.Len())
	for i, id := range src.Tokens() {
		got[i] = int(id)
	}
	if !slices.Equal(got, want) {
		t.Errorf("directory tokens %v, want %v", got, want)
	}
	if src.VocabSize() != 257 {
		t.Errorf("vocab %d", src.VocabSize())
	}
	if _, err := NewTextFile(t.TempDir(), tokenizer.Byte(), 1); err == nil {
		t.Error("empty directory accepted")
	}
	if _, err := NewTextFile(filepath.Join(dir, "missing.txt"), tokenizer.Byte(), 1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc"), 0o644)
	s, err := NewTextFile(short, tokenizer.Byte(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Next(1, 3); !errors.Is(err, ErrTooShort) {
		t.Errorf("window past the corpus: %v", err)
	}
	if _, _, err := s.Next(1, 2); err != nil {
		t.Errorf("exact-fit window: %v", err)
	}
}

// TestTextChunkedTokenization: a file larger than one tokenization chunk
// gives the same bytes back, and for the byte tokenizer exactly the
// whole-file encoding.
func TestTextChunkedTokenization(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	words := []string{"the", "state", "of", "union", "is", "strong", "1790", "Congress,", "é", "\n", "\n\n"}
	var sb strings.Builder
	for sb.Len() < 3*chunkBytes {
		sb.WriteString(words[rng.IntN(len(words))])
		sb.WriteByte(' ')
	}
	text := sb.String()
	path := filepath.Join(t.TempDir(), "corpus.txt")
	os.WriteFile(path, []byte(text), 0o644)

	src, err := NewTextFile(path, tokenizer.Byte(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(src.Tokens(), toInt32(tokenizer.Byte().Encode(text))) {
		t.Error("chunked byte tokens differ from the whole-file encoding")
	}
	gpt2, err := tokenizer.GPT2()
	if err != nil {
		t.Fatal(err)
	}
	src, err = NewTextFile(path, gpt2, 1)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int, src.Len())
	for i, id := range src.Tokens() {
		ids[i] = int(id)
	}
	if gpt2.Decode(ids) != text {
		t.Error("GPT-2 tokens do not decode to the file")
	}
	if src.VocabSize() != 50257 {
		t.Errorf("vocab %d", src.VocabSize())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := LoadTextFile(ctx, path, gpt2, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled load: %v", err)
	}
}

func toInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

func TestTextSplit(t *testing.T) {
	src, _ := NewTokens(counting(1000), 1000, 5)
	train, val, err := src.Split(0.1)
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 900 || val.Len() != 100 || val.Tokens()[0] != 900 {
		t.Errorf("split %d / %d", train.Len(), val.Len())
	}
	for range 50 {
		in, _, _ := train.Next(2, 10)
		for _, id := range in {
			if id >= 900 {
				t.Fatal("training window reaches held-out tokens")
			}
		}
	}
	for _, bad := range []float64{0, 1, -0.5, 0.9999} {
		if _, _, err := src.Split(bad); err == nil {
			t.Errorf("Split(%g) accepted", bad)
		}
	}
}

func TestNewTokensChecksIDs(t *testing.T) {
	if _, err := NewTokens([]int32{1, 2, 300}, 257, 1); err == nil {
		t.Error("id past the vocabulary accepted")
	}
	if _, err := NewTokens([]int32{1, -1}, 257, 1); err == nil {
		t.Error("negative id accepted")
	}
	if _, err := NewTokens([]int32{1}, 257, 1); !errors.Is(err, ErrTooShort) {
		t.Error("one-token corpus accepted")
	}
}

var _ Source = (*TextSource)(nil)
var _ Source = (*Synthetic)(nil)
