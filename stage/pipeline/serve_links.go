package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
)

// serveEvent is what a serving link's reader hands its owner: a batch
// with its frame, a drop, a control message (a blob assembled), or the
// error that ended the link.
type serveEvent struct {
	from  peer.ID
	link  *wire.Link
	msg   *serveMsg
	frame wire.Frame
	ctl   *Ctl
	blob  []byte
	file  string // a spooled blob: the owner consumes and removes it
	err   error
}

// readServeLink forwards a serving link's messages to out until the link
// ends, then sends its error. A batch message and the forward frame after
// it arrive as one event; a frame without its message, or one whose rows
// do not match it, ends the link.
func readServeLink(ctx context.Context, l *wire.Link, out chan<- serveEvent, rule blobRule) {
	from := l.RemotePeer()
	send := func(ev serveEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) {
		l.Close()
		send(serveEvent{from: from, link: l, err: err})
	}
	for {
		f, err := l.Recv(ctx)
		if err != nil {
			send(serveEvent{from: from, link: l, err: err})
			return
		}
		ev := serveEvent{from: from, link: l}
		switch {
		case f.Kind != wire.KindControl:
			fail(fmt.Errorf("pipeline: %s frame without a batch message", f.Kind))
			return
		case len(f.Control) > 0 && f.Control[0] == msgServe:
			m, err := decodeServeMsg(f.Control)
			if err != nil {
				fail(err)
				return
			}
			ev.msg = &m
			if m.Kind == serveBatch {
				if ev.frame, err = l.Recv(ctx); err != nil {
					send(serveEvent{from: from, link: l, err: err})
					return
				}
				if ev.frame.Kind != wire.KindForward || ev.frame.Tokens != m.tokens() {
					fail(fmt.Errorf("pipeline: batch %d of %d tokens came with a %s frame of %d", m.Frame, m.tokens(), ev.frame.Kind, ev.frame.Tokens))
					return
				}
			}
		default:
			if ev.ctl, ev.blob, ev.file, err = readCtl(ctx, l, f, rule); err != nil {
				fail(err)
				return
			}
		}
		if !send(ev) {
			return
		}
	}
}

// sendServe writes a serving message and, for a batch, its frame. seq is
// the link's frame counter (the frame's Step), advanced here.
func sendServe(ctx context.Context, l *wire.Link, seq *uint64, m serveMsg, data []float32, ids []int) error {
	p, err := encodeServeMsg(m)
	if err != nil {
		return err
	}
	if err := l.Send(ctx, wire.Frame{Kind: wire.KindControl, Step: m.Frame, Control: p}); err != nil {
		return err
	}
	if m.Kind != serveBatch {
		return nil
	}
	*seq++
	return l.Send(ctx, wire.Frame{Kind: wire.KindForward, Step: *seq, Micro: m.Lane, Data: data, IDs: ids})
}

// encodeWeights serialises a stage's parameters under their checkpoint
// names (factors of a subspace model under their .z names).
func encodeWeights(st *model.Stage) ([]byte, error) {
	var ts []safetensors.Tensor
	for _, t := range st.Tensors() {
		ts = append(ts, safetensors.Tensor(t))
	}
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, ts, nil); err != nil {
		return nil, fmt.Errorf("pipeline: encode weights: %w", err)
	}
	return buf.Bytes(), nil
}

// loadWeightsFile builds the serving stage of cfg covering span from a
// received weights file, tensor by tensor (decodeWeights).
func loadWeightsFile(path string, cfg model.Config, span model.Span, be tensor.Backend) (*model.Stage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return decodeWeights(io.NewSectionReader(f, 0, st.Size()), cfg, span, be)
}

// decodeWeights builds the serving stage of cfg covering span from a
// weights blob: built for inference (no gradients), each parameter read
// straight from the blob (no random initialisation), which must hold
// exactly the stage's tensors at their shapes with finite values.
func decodeWeights(r *io.SectionReader, cfg model.Config, span model.Span, be tensor.Backend) (*model.Stage, error) {
	f, err := safetensors.OpenReader(r, r.Size())
	if err != nil {
		return nil, fmt.Errorf("pipeline: weights: %w", err)
	}
	want := checkpoint.StageTensors(cfg, span)
	if n := len(f.Tensors()); n != len(want) {
		return nil, fmt.Errorf("pipeline: weights hold %d tensors, blocks %d-%d need %d", n, span.First, span.Last-1, len(want))
	}
	load := func(name string, shape []int, off int, dst []float32) error {
		return f.ReadFloat32At(name, shape, int64(off), dst)
	}
	opts := []model.Option{model.WithBackend(be), model.WithoutGrad(), model.WithValues(load)}
	if allBF16(f) {
		opts = append(opts, model.WithWeightDType(tensor.BFloat16))
	}
	st, err := model.NewStage(cfg, span, opts...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: weights: %w", err)
	}
	return st, nil
}

// allBF16 says the weights came as bfloat16, so the stage keeps them so.
func allBF16(f *safetensors.File) bool {
	ts := f.Tensors()
	for _, t := range ts {
		if t.DType != safetensors.BF16 {
			return false
		}
	}
	return len(ts) > 0
}
