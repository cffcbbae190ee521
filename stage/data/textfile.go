package data

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// MaxTextBytes bounds the text a TextSource loads: it is tokenized once
// into memory, 4 bytes a token.
const MaxTextBytes = 1 << 30

// chunkBytes is the unit of parallel tokenization. Chunks end after a line
// break, so a token can only differ from encoding the file whole where a
// tokenizer would merge across a line break.
const chunkBytes = 64 << 10

// TextSource serves windows of a tokenized text corpus. Each epoch cuts
// the token stream into seqLen+1-token windows at a random offset and
// serves them in a seeded random order; the next epoch reshuffles. It is
// deterministic for a seed and safe for concurrent use.
type TextSource struct {
	tokens []int32
	vocab  int
	seed   uint64

	mu     sync.Mutex
	seqLen int     // the window length the order was built for
	epoch  int     // epochs started, from 0
	order  []int32 // window starts of this epoch, shuffled
	cursor int     // next index into order
}

// NewTextFile tokenizes path with tok and serves windows of it. path is a
// text file, or a directory whose *.txt files (in name order) are the
// documents, joined by the tokenizer's EOS when it has one.
func NewTextFile(path string, tok tokenizer.Tokenizer, seed uint64) (*TextSource, error) {
	return LoadTextFile(context.Background(), path, tok, seed)
}

// LoadTextFile is NewTextFile with a context that can stop tokenization.
func LoadTextFile(ctx context.Context, path string, tok tokenizer.Tokenizer, seed uint64) (*TextSource, error) {
	docs, err := readDocs(path)
	if err != nil {
		return nil, err
	}
	var tokens []int32
	for i, d := range docs {
		ids, err := tokenize(ctx, d, tok)
		if err != nil {
			return nil, fmt.Errorf("data: %s: %w", path, err)
		}
		if i > 0 && tok.EOS() >= 0 {
			tokens = append(tokens, int32(tok.EOS()))
		}
		tokens = append(tokens, ids...)
	}
	return NewTokens(tokens, tok.VocabSize(), seed)
}

// NewTokens serves windows of an already tokenized corpus, checking every
// id against vocab.
func NewTokens(tokens []int32, vocab int, seed uint64) (*TextSource, error) {
	if vocab < 1 {
		return nil, fmt.Errorf("data: vocabulary size %d", vocab)
	}
	for i, id := range tokens {
		if id < 0 || int(id) >= vocab {
			return nil, fmt.Errorf("data: token %d has id %d outside the vocabulary of %d", i, id, vocab)
		}
	}
	if len(tokens) < 2 {
		return nil, fmt.Errorf("%w: %d tokens", ErrTooShort, len(tokens))
	}
	return &TextSource{tokens: tokens, vocab: vocab, seed: seed}, nil
}

func readDocs(path string) ([][]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if !st.IsDir() {
		b, err := readLimited(path, MaxTextBytes)
		if err != nil {
			return nil, err
		}
		return [][]byte{b}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	var docs [][]byte
	total := int64(0)
	for _, e := range entries { // ReadDir sorts by name
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".txt") {
			continue
		}
		b, err := readLimited(filepath.Join(path, e.Name()), MaxTextBytes-total)
		if err != nil {
			return nil, err
		}
		total += int64(len(b))
		docs = append(docs, b)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("data: %s holds no .txt files", path)
	}
	return docs, nil
}

func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("data: reading %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("data: %s: text beyond the %d-byte limit", path, int64(MaxTextBytes))
	}
	return b, nil
}

// tokenize encodes text in line-aligned chunks on all cores, keeping
// their order.
func tokenize(ctx context.Context, text []byte, tok tokenizer.Tokenizer) ([]int32, error) {
	var chunks [][]byte
	for len(text) > 0 {
		n := min(len(text), chunkBytes)
		if n < len(text) {
			if i := bytes.LastIndexByte(text[:n], '\n'); i > 0 {
				n = i + 1
			}
		}
		chunks = append(chunks, text[:n])
		text = text[n:]
	}
	out := make([][]int32, len(chunks))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, c := range chunks {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			ids := tok.Encode(string(c))
			buf := make([]int32, len(ids))
			for j, id := range ids {
				buf[j] = int32(id)
			}
			out[i] = buf
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return slices.Concat(out...), nil
}

// Len is the number of tokens in the corpus.
func (s *TextSource) Len() int { return len(s.tokens) }

// VocabSize is the tokenizer's vocabulary size.
func (s *TextSource) VocabSize() int { return s.vocab }

// Tokens returns the corpus (shared; do not modify).
func (s *TextSource) Tokens() []int32 { return s.tokens }

// Split cuts off the last fraction of the corpus as a held-out source with
// its own seed, and returns the rest as the training source.
func (s *TextSource) Split(heldOut float64) (train, val *TextSource, err error) {
	if !(heldOut > 0 && heldOut < 1) {
		return nil, nil, fmt.Errorf("data: held-out fraction %g outside (0, 1)", heldOut)
	}
	cut := len(s.tokens) - int(float64(len(s.tokens))*heldOut)
	if cut < 2 || len(s.tokens)-cut < 2 {
		return nil, nil, fmt.Errorf("%w: %d tokens cannot be split %g held out", ErrTooShort, len(s.tokens), heldOut)
	}
	train = &TextSource{tokens: s.tokens[:cut:cut], vocab: s.vocab, seed: s.seed}
	val = &TextSource{tokens: s.tokens[cut:], vocab: s.vocab, seed: s.seed ^ 0x9e3779b97f4a7c15}
	return train, val, nil
}

// Next returns batch windows. Windows of one epoch do not overlap; when an
// epoch's windows run out the next epoch starts with a new offset and
// order. Changing seqLen restarts the current epoch's order.
func (s *TextSource) Next(batch, seqLen int) (inputs, targets []int32, err error) {
	if err := checkShape(batch, seqLen); err != nil {
		return nil, nil, err
	}
	if len(s.tokens) < seqLen+1 {
		return nil, nil, fmt.Errorf("%w: %d tokens, window needs %d", ErrTooShort, len(s.tokens), seqLen+1)
	}
	inputs = make([]int32, batch*seqLen)
	targets = make([]int32, batch*seqLen)
	s.mu.Lock()
	defer s.mu.Unlock()
	if seqLen != s.seqLen {
		s.seqLen = seqLen
		s.shuffle()
	}
	for r := range batch {
		if s.cursor == len(s.order) {
			s.epoch++
			s.shuffle()
		}
		start := int(s.order[s.cursor])
		s.cursor++
		copy(inputs[r*seqLen:(r+1)*seqLen], s.tokens[start:start+seqLen])
		copy(targets[r*seqLen:(r+1)*seqLen], s.tokens[start+1:start+seqLen+1])
	}
	return inputs, targets, nil
}

// shuffle lays out the current epoch: window starts offset+i*seqLen, in an
// order drawn from (seed, epoch) alone, so any epoch can be rebuilt.
func (s *TextSource) shuffle() {
	rng := rand.New(rand.NewPCG(s.seed, uint64(s.epoch)))
	n := len(s.tokens)
	// A random offset in [0, seqLen) shifts window boundaries between
	// epochs; keep at least one window.
	offset := rng.IntN(min(s.seqLen, n-s.seqLen))
	count := (n - offset - 1) / s.seqLen
	s.order = s.order[:0]
	for i := range count {
		s.order = append(s.order, int32(offset+i*s.seqLen))
	}
	rng.Shuffle(len(s.order), func(i, j int) { s.order[i], s.order[j] = s.order[j], s.order[i] })
	s.cursor = 0
}

// TextState is a TextSource's position, for resuming from a checkpoint.
type TextState struct {
	SeqLen int `json:"seq_len"`
	Epoch  int `json:"epoch"`
	Cursor int `json:"cursor"`
}

// State returns the current position.
func (s *TextSource) State() TextState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return TextState{SeqLen: s.seqLen, Epoch: s.epoch, Cursor: s.cursor}
}

// Restore moves to a position State returned, on the same corpus and seed,
// so training resumes with the windows it would have seen.
func (s *TextSource) Restore(st TextState) error {
	if st.SeqLen == 0 && st.Epoch == 0 && st.Cursor == 0 {
		s.mu.Lock()
		s.seqLen, s.epoch, s.cursor, s.order = 0, 0, 0, nil
		s.mu.Unlock()
		return nil
	}
	if st.SeqLen < 1 || len(s.tokens) < st.SeqLen+1 || st.Epoch < 0 {
		return fmt.Errorf("data: cannot restore %+v on %d tokens", st, len(s.tokens))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	oldLen, oldEpoch, oldCursor := s.seqLen, s.epoch, s.cursor
	s.seqLen, s.epoch = st.SeqLen, st.Epoch
	s.shuffle()
	if st.Cursor < 0 || st.Cursor > len(s.order) {
		s.seqLen, s.epoch = oldLen, oldEpoch
		if oldLen > 0 {
			s.shuffle()
		}
		s.cursor = oldCursor
		return fmt.Errorf("data: restored cursor %d outside the epoch's %d windows", st.Cursor, len(s.order))
	}
	s.cursor = st.Cursor
	return nil
}
