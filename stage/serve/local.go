package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/holopeer/holopeer/stage/model"
)

// Local is single-process generation: the whole model in one stage on
// this machine, the reference the swarm is measured against. It runs one
// sequence at a time (a stage is not safe for concurrent use): the
// prompt in one call, then one token at a time with a KV cache.
type Local struct {
	mu sync.Mutex
	st *model.Stage
}

// NewLocal serves st, which must hold the whole model (model.Whole).
func NewLocal(st *model.Stage) (*Local, error) {
	if sp := st.Span(); !sp.Embed || !sp.Head {
		return nil, errors.New("serve: local generation needs the whole model in one stage")
	}
	return &Local{st: st}, nil
}

// Generate implements Engine.
func (l *Local) Generate(ctx context.Context, prompt []int32, maxNew int, pick func([]float32) int32, emit func(int32) bool) error {
	cfg := l.st.Config()
	switch {
	case len(prompt) == 0 || maxNew < 1:
		return fmt.Errorf("serve: %d prompt tokens, %d new", len(prompt), maxNew)
	case len(prompt)+maxNew > cfg.MaxSeq:
		return fmt.Errorf("serve: %d prompt + %d new tokens exceed the context of %d", len(prompt), maxNew, cfg.MaxSeq)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c := l.st.NewCache()
	defer c.Free()
	out, err := l.st.Infer(c, model.Input{Batch: 1, Seq: len(prompt), Tokens: prompt})
	if err != nil {
		return err
	}
	logits := out.Logits[(len(prompt)-1)*cfg.Vocab:]
	for n := 1; ; n++ {
		tok := pick(logits)
		if emit(tok) || n == maxNew {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		out, err := l.st.Infer(c, model.Input{Batch: 1, Seq: 1, Tokens: []int32{tok}})
		if err != nil {
			return err
		}
		logits = out.Logits
	}
}
