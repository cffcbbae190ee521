package opcheck

import (
	"slices"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/tensor"
)

// panics returns the message f panics with, or "" if it returns.
func panics(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg, _ = r.(string)
			if msg == "" {
				msg = "non-string panic"
			}
		}
	}()
	f()
	return ""
}

func TestChecks(t *testing.T) {
	const c = Checker("dev")
	attn := tensor.AttnShape{Batch: 2, Heads: 4, KVHeads: 2, HeadDim: 8, SeqQ: 3, SeqK: 3, Scale: 1}
	q, k, lse := 2*3*4*8, 2*3*2*8, 2*4*3
	for _, tc := range []struct {
		name string
		ok   func()
		bad  func()
		want string
	}{
		{"len", func() { c.Len("Copy", 3, 3) }, func() { c.Len("Copy", 3, 4) }, "dev: Copy: length 3, want 4"},
		{"rows", func() { c.Rows("Softmax", 6, 3) }, func() { c.Rows("Softmax", 7, 3) }, "dev: Softmax: length 7 is not a multiple of row width 3"},
		{"zero width", func() {}, func() { c.Rows("Softmax", 0, 0) }, "row width 0"},
		{"alloc", func() { c.Alloc(tensor.Int32, 0) }, func() { c.Alloc(tensor.Float32, -1) }, "dev: negative allocation -1"},
		{"view", func() { c.View(1, 2, 3) }, func() { c.View(2, 2, 3) }, "dev: view [2,4) of a buffer of 3"},
		{"gemm", func() { c.Gemm(2, 3, 4, 8, 12, 6) }, func() { c.Gemm(2, 2, 2, 3, 4, 4) }, "dev: Gemm 2x2x2 with buffers a=3 b=4 c=4"},
		{"rope", func() { c.RoPE(16, 2, 2, 2, 4) }, func() { c.RoPE(12, 2, 1, 2, 3) }, "dev: RoPE head dim 3 must be even"},
		{"rmsnorm", func() { c.RMSNorm(6, 2, 6, 3, 3) }, func() { c.RMSNorm(6, 3, 6, 3, 3) }, "dev: RMSNorm rstd: length 3, want 2"},
		{"xent", func() { c.SoftmaxCrossEntropy(10, 10, 2, 5) }, func() { c.SoftmaxCrossEntropy(10, 10, 1, 5) }, "dev: SoftmaxCrossEntropy targets: length 1, want 2"},
		{"attention", func() { c.Attention("Attention", attn, q, k, k, q, lse) }, func() { c.Attention("Attention", attn, q, k, k, q, lse+1) }, "do not fit"},
		{"attention shape", func() {}, func() { c.Attention("Attention", tensor.AttnShape{}, 0, 0, 0, 0, 0) }, "dev: Attention: tensor: attention shape"},
		{"adamw", func() { c.AdamW(3, 3, 3, 3, tensor.AdamWStep{Step: 1}) }, func() { c.AdamW(3, 3, 3, 3, tensor.AdamWStep{}) }, "dev: AdamW step counts from 1"},
	} {
		if msg := panics(tc.ok); msg != "" {
			t.Errorf("%s: a good call panicked: %s", tc.name, msg)
		}
		if msg := panics(tc.bad); !strings.Contains(msg, tc.want) {
			t.Errorf("%s: panicked with %q, want %q", tc.name, msg, tc.want)
		}
	}
	if got := c.Gather(6, 15, 2, 3); got != 5 {
		t.Errorf("Gather: %d table rows, want 5", got)
	}
}

func TestIndexErrors(t *testing.T) {
	if got := IndexErrors(0); got != nil {
		t.Errorf("no bits: %v", got)
	}
	got := IndexErrors(ErrGatherID | ErrRopePos)
	if want := []string{"Gather: id out of range", "RoPE: negative position"}; !slices.Equal(got, want) {
		t.Errorf("IndexErrors = %v, want %v", got, want)
	}
}
