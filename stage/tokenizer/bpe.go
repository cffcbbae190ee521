package tokenizer

import (
	"container/heap"
	"fmt"
	"sync"
	"unicode/utf8"
)

// bpe is a Hugging Face BPE model: a vocabulary, ranked merges, and what
// to do with characters outside the vocabulary (byte fallback or unk).
type bpe struct {
	vocab        map[string]int
	idToToken    []string // "" where no model token has the id
	merges       map[uint64]mergeTarget
	unk          int // -1 if none
	fuseUnk      bool
	byteFallback bool
	byteIDs      [256]int // ids of "<0x00>".."<0xFF>", -1 where absent
	ignoreMerges bool

	mu    sync.Mutex
	cache map[string][]int
}

type mergeTarget struct {
	rank int
	id   int
}

func pairKey(a, b int) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// Words longer than this are not cached: a Llama-2 style tokenizer with no
// pre-tokenizer hands over whole lines, which never repeat.
const (
	maxCachedWord = 64
	maxCacheSize  = 1 << 16
)

// encodeWord appends the ids of one pre-tokenized word to out.
func (m *bpe) encodeWord(word string, out []int) []int {
	if word == "" {
		return out
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, id)
		}
	}
	cacheable := len(word) <= maxCachedWord
	if cacheable {
		m.mu.Lock()
		ids, ok := m.cache[word]
		m.mu.Unlock()
		if ok {
			return append(out, ids...)
		}
	}
	ids := m.merge(m.symbols(word))
	if cacheable {
		m.mu.Lock()
		if len(m.cache) >= maxCacheSize {
			clear(m.cache)
		}
		m.cache[word] = ids
		m.mu.Unlock()
	}
	return append(out, ids...)
}

// symbol is one node of the doubly linked list a word is merged in.
type symbol struct {
	id         int
	prev, next int
	gone       bool
}

// symbols splits a word into characters, each a vocabulary id, a run of
// byte-fallback ids, or unk. A character with none of these is dropped, as
// there is no id to stand for it.
func (m *bpe) symbols(word string) []symbol {
	syms := make([]symbol, 0, len(word))
	add := func(id int) {
		syms = append(syms, symbol{id: id, prev: len(syms) - 1, next: len(syms) + 1})
	}
	lastUnk := false
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+n]
		i += n
		if id, ok := m.vocab[ch]; ok {
			add(id)
			lastUnk = false
			continue
		}
		if m.byteFallback && m.hasBytes(ch) {
			for j := 0; j < len(ch); j++ {
				add(m.byteIDs[ch[j]])
			}
			lastUnk = false
			continue
		}
		if m.unk >= 0 {
			if !(m.fuseUnk && lastUnk) {
				add(m.unk)
			}
			lastUnk = true
		}
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

// hasBytes reports whether every byte of ch has a byte-fallback token;
// Hugging Face falls back to unk for a character when one is missing.
func (m *bpe) hasBytes(ch string) bool {
	for j := 0; j < len(ch); j++ {
		if m.byteIDs[ch[j]] < 0 {
			return false
		}
	}
	return true
}

// mergeCand is a possible merge of the symbol at pos with its successor.
type mergeCand struct {
	pos, rank, id int
}

type mergeQueue []mergeCand

func (q mergeQueue) Len() int { return len(q) }
func (q mergeQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q mergeQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *mergeQueue) Push(x any)   { *q = append(*q, x.(mergeCand)) }
func (q *mergeQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// merge applies merges lowest rank first, leftmost among equals, as
// Hugging Face's BPE does, in O(n log n) so that long unsplit inputs stay
// cheap.
func (m *bpe) merge(syms []symbol) []int {
	q := make(mergeQueue, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if t, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q = append(q, mergeCand{pos: i, rank: t.rank, id: t.id})
		}
	}
	heap.Init(&q)
	for q.Len() > 0 {
		c := heap.Pop(&q).(mergeCand)
		left := &syms[c.pos]
		if left.gone || left.next < 0 {
			continue
		}
		right := &syms[left.next]
		// The pair may have changed since the candidate was queued.
		if t, ok := m.merges[pairKey(left.id, right.id)]; !ok || t.id != c.id {
			continue
		}
		left.id = c.id
		right.gone = true
		left.next = right.next
		if left.next >= 0 {
			syms[left.next].prev = c.pos
		}
		if left.prev >= 0 {
			p := left.prev
			if t, ok := m.merges[pairKey(syms[p].id, left.id)]; ok {
				heap.Push(&q, mergeCand{pos: p, rank: t.rank, id: t.id})
			}
		}
		if left.next >= 0 {
			if t, ok := m.merges[pairKey(left.id, syms[left.next].id)]; ok {
				heap.Push(&q, mergeCand{pos: c.pos, rank: t.rank, id: t.id})
			}
		}
	}
	ids := make([]int, 0, len(syms))
	for _, s := range syms {
		if !s.gone {
			ids = append(ids, s.id)
		}
	}
	return ids
}

// byteToken is the spelling of a byte-fallback token.
func byteToken(b byte) string { return fmt.Sprintf("<0x%02X>", b) }
