package codec

import "sync"

// scratch recycles the n×d work buffers of the subspace codec, which
// encodes one microbatch at a time on each link.
var scratch floatPool

type floatPool struct{ p sync.Pool }

func (fp *floatPool) Get(n int) []float32 {
	if v, ok := fp.p.Get().(*[]float32); ok && cap(*v) >= n {
		return (*v)[:n]
	}
	return make([]float32, n)
}

func (fp *floatPool) Put(b []float32) { fp.p.Put(&b) }
