package devmem

import (
	"slices"
	"testing"
)

func TestBlockSize(t *testing.T) {
	for _, c := range [][2]int64{{0, 0}, {1, 512}, {512, 512}, {513, 1024}, {4000, 4096}} {
		if got := BlockSize(c[0]); got != c[1] {
			t.Errorf("BlockSize(%d) = %d, want %d", c[0], got, c[1])
		}
	}
}

// A freed block comes back for the next allocation of its size only, and
// the counts follow it.
func TestPoolReusesBySize(t *testing.T) {
	var p Pool[int]
	if _, ok := p.Take(512); ok {
		t.Fatal("an empty pool handed out a block")
	}
	p.Allocated(512)
	p.Allocated(1024)
	p.Put(7, 512)
	if live, cached := p.Stats(); live != 1024 || cached != 512 {
		t.Fatalf("stats %d live, %d cached", live, cached)
	}
	if _, ok := p.Take(1024); ok {
		t.Fatal("a 512-byte block was handed out for 1024")
	}
	if h, ok := p.Take(512); !ok || h != 7 {
		t.Fatalf("Take(512) = %d, %v", h, ok)
	}
	if live, cached := p.Stats(); live != 1536 || cached != 0 {
		t.Fatalf("stats %d live, %d cached", live, cached)
	}
	p.Put(7, 512)
	p.Put(8, 1024)
	var released []int
	p.Drain(func(h int) { released = append(released, h) })
	slices.Sort(released)
	if !slices.Equal(released, []int{7, 8}) {
		t.Fatalf("released %v", released)
	}
	if live, cached := p.Stats(); live != 0 || cached != 0 {
		t.Fatalf("after Drain: %d live, %d cached", live, cached)
	}
	if _, ok := p.Take(512); ok {
		t.Fatal("a drained block was handed out")
	}
}
