package model_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
)

// TestOneFOneBOnConcurrentStages runs a 2-stage pipeline the way a swarm
// does: each stage on its own goroutine (sharing one backend), activations
// and gradients passed over channels, in 1F1B order (stage 0 keeps two
// microbatches in flight). Gradients must equal a sequential run's.
func TestOneFOneBOnConcurrentStages(t *testing.T) {
	cfg := variants(4)["subspace"]
	spans, _ := model.EvenSpans(cfg.Layers, 2)
	var mbs []model.Input
	total := 0
	for seed := uint64(0); seed < 3; seed++ {
		b, n := batch(cfg, 30+seed)
		mbs = append(mbs, b...)
		total += n
	}
	newPair := func() []*model.Stage {
		stages, err := model.NewStages(cfg, spans, model.WithSeed(3), model.WithBackend(cpu.New()))
		if err != nil {
			t.Fatal(err)
		}
		modeltest.Perturb(t, perturbed, stages...)
		return stages
	}
	input := func(i int, hidden []float32) model.Input {
		mb := mbs[i]
		in := model.Input{Batch: mb.Batch, Seq: mb.Seq, Tokens: mb.Tokens, Positions: mb.Positions, Hidden: hidden}
		if hidden != nil {
			in.Targets, in.LossTokens = mb.Targets, total
		}
		return in
	}

	// Sequential reference: each microbatch forward and back in turn.
	seq := newPair()
	for i := range mbs {
		out, err := seq[0].Forward(i, input(i, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := seq[1].Forward(i, input(i, out.Hidden)); err != nil {
			t.Fatal(err)
		}
		g, err := seq[1].Backward(i, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := seq[0].Backward(i, g); err != nil {
			t.Fatal(err)
		}
	}

	par := newPair()
	type msg struct {
		mb   int
		data []float32
	}
	fwd, bwd := make(chan msg, len(mbs)), make(chan msg, len(mbs))
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { // stage 0: warm-up of 2 forwards, then 1F1B, then drain
		defer close(fwd)
		next, done := 0, 0
		for done < len(mbs) {
			if next < len(mbs) && next-done < 2 {
				out, err := par[0].Forward(next, input(next, nil))
				if err != nil {
					errs <- err
					return
				}
				fwd <- msg{next, out.Hidden}
				next++
				continue
			}
			m, ok := <-bwd
			if !ok {
				errs <- errors.New("stage 1 stopped early")
				return
			}
			if _, err := par[0].Backward(m.mb, m.data); err != nil {
				errs <- err
				return
			}
			done++
		}
	})
	wg.Go(func() { // stage 1: forward, then backward at once
		defer close(bwd)
		for range mbs {
			m, ok := <-fwd
			if !ok {
				return // stage 0 failed and said so
			}
			if _, err := par[1].Forward(m.mb, input(m.mb, m.data)); err != nil {
				errs <- err
				return
			}
			g, err := par[1].Backward(m.mb, nil)
			if err != nil {
				errs <- err
				return
			}
			bwd <- msg{m.mb, g}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for si := range par {
		for _, p := range par[si].Params() {
			q, _ := seq[si].Param(p.Name)
			if !slices.Equal(p.GradData(), q.GradData()) {
				t.Errorf("stage %d %s: 1F1B gradients differ from the sequential run", si, p.Name)
			}
		}
	}
}
