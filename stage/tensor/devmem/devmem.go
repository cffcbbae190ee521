// Package devmem keeps the books of a device backend's memory pool
// (cuda, metal): allocations are rounded up to whole blocks, a freed block
// waits in the pool for the next allocation of its size, and the bytes
// handed out and kept are counted. Stages allocate the same shapes every
// microbatch, so blocks come back and are reused without a call to the
// driver. The pool holds the backend's handles only; allocating and
// freeing device memory, and locking, stay with the backend.
package devmem

// BlockAlign is the granularity of pool blocks, in bytes.
const BlockAlign = 512

// BlockSize rounds bytes up to a whole block.
func BlockSize(bytes int64) int64 { return (bytes + BlockAlign - 1) / BlockAlign * BlockAlign }

// Pool is a pool of device blocks of type H (a pointer or handle),
// grouped by size. The zero value is empty and ready. It is not safe for
// concurrent use: the backend's lock guards it.
type Pool[H any] struct {
	free   map[int64][]H
	live   int64 // bytes handed out
	cached int64 // bytes in free
}

// Take hands out a pooled block of size bytes, if there is one.
func (p *Pool[H]) Take(size int64) (h H, ok bool) {
	free := p.free[size]
	if len(free) == 0 {
		return h, false
	}
	h = free[len(free)-1]
	p.free[size] = free[:len(free)-1]
	p.cached -= size
	p.live += size
	return h, true
}

// Allocated counts a block of size bytes the backend allocated from the
// device as handed out.
func (p *Pool[H]) Allocated(size int64) { p.live += size }

// Put takes back a freed block of size bytes for reuse.
func (p *Pool[H]) Put(h H, size int64) {
	if p.free == nil {
		p.free = map[int64][]H{}
	}
	p.free[size] = append(p.free[size], h)
	p.cached += size
	p.live -= size
}

// Drain empties the pool, handing every block in it to release.
func (p *Pool[H]) Drain(release func(H)) {
	for size, free := range p.free {
		for _, h := range free {
			release(h)
		}
		delete(p.free, size)
	}
	p.cached = 0
}

// Stats reports the bytes handed out and the bytes kept in the pool.
func (p *Pool[H]) Stats() (live, cached int64) { return p.live, p.cached }
