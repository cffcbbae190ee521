package codec

import (
	"sync"

	"github.com/holopeer/holopeer/stage/subspace"
)

// DefaultEFixCacheBytes bounds the E_fix rows a subspace codec keeps.
// Generating a row costs d hash-and-sum normals, more than the k×d
// projection it feeds, and token frequencies are Zipf-like, so a modest
// cache of hot rows removes most of that work (the whole table of a byte
// vocabulary at d_model 128 is 128 KiB).
const DefaultEFixCacheBytes = 16 << 20

// efixCache holds rows of E_fix by token id, evicting first-in first-out.
// It is shared by every user of one codec and safe for concurrent use.
type efixCache struct {
	b    *subspace.Basis
	max  int // rows
	mu   sync.Mutex
	rows map[int][]float32
	fifo []int // ids in insertion order; a ring once full
	next int
}

func newEFixCache(b *subspace.Basis, bytes int) *efixCache {
	rows := bytes / (4 * b.Dim())
	if bytes < 0 || rows < 1 {
		return &efixCache{b: b}
	}
	rows = min(rows, b.Config().Vocab)
	return &efixCache{b: b, max: rows, rows: make(map[int][]float32, rows)}
}

// fill writes E_fix[ids[t]] into dst[t·d:(t+1)·d] for every t.
func (c *efixCache) fill(ids []int, dst []float32) {
	d := c.b.Dim()
	if c.max == 0 {
		for t, id := range ids {
			c.b.EFixRow(id, dst[t*d:(t+1)*d])
		}
		return
	}
	var miss []int // positions in ids
	c.mu.Lock()
	for t, id := range ids {
		if r, ok := c.rows[id]; ok {
			copy(dst[t*d:(t+1)*d], r)
		} else {
			miss = append(miss, t)
		}
	}
	c.mu.Unlock()
	if len(miss) == 0 {
		return
	}
	for _, t := range miss {
		c.b.EFixRow(ids[t], dst[t*d:(t+1)*d])
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range miss {
		id := ids[t]
		if _, ok := c.rows[id]; ok {
			continue
		}
		row := dst[t*d : (t+1)*d : (t+1)*d]
		if len(c.fifo) < c.max {
			c.rows[id] = append([]float32(nil), row...)
			c.fifo = append(c.fifo, id)
			continue
		}
		old := c.fifo[c.next]
		buf := c.rows[old]
		delete(c.rows, old)
		copy(buf, row)
		c.rows[id] = buf
		c.fifo[c.next] = id
		c.next = (c.next + 1) % c.max
	}
}
