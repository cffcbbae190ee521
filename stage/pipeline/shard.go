package pipeline

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/safetensors"
)

// A shard is one stage's training state, as it travels to the researcher
// at a checkpoint and back to a (new) stage at a restore: its parameters
// under their Hugging Face names, the AdamW moments, and the step they
// belong to, in the safetensors format.

const (
	metaStep      = "holopeer.step"
	metaAdamSteps = "holopeer.adam_steps"
	gradPrefix    = "grad."
)

// layoutShard lays out a stage's parameters and optimizer state as a
// shard without downloading them: the shard streams one tensor at a time
// (layoutShard(...).WriteTo), and its size is known before it is sent.
func layoutShard(st *model.Stage, opt *optim.AdamW, step uint64) (*safetensors.Encoded, error) {
	var ts []safetensors.Source
	for _, t := range append(st.LazyTensors(), opt.LazyState(st.Params())...) {
		read := t.Read
		ts = append(ts, safetensors.Source{Name: t.Name, Shape: t.Shape, Read: func(dst []float32) error { read(dst); return nil }})
	}
	meta := map[string]string{
		metaStep:      strconv.FormatUint(step, 10),
		metaAdamSteps: strconv.Itoa(opt.Steps()),
	}
	e, err := safetensors.Layout(ts, meta)
	if err != nil {
		return nil, fmt.Errorf("pipeline: encode shard: %w", err)
	}
	return e, nil
}

// encodeShard serialises a stage's parameters and optimizer state in
// memory (the researcher's own small stages).
func encodeShard(st *model.Stage, opt *optim.AdamW, step uint64) ([]byte, error) {
	e, err := layoutShard(st, opt, step)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(int(e.Size()))
	if _, err := e.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func bytesReader(b []byte) *io.SectionReader {
	return io.NewSectionReader(bytes.NewReader(b), 0, int64(len(b)))
}

// decodeShard loads a shard into st and opt, one tensor at a time. The
// header is checked first: it must hold every parameter of the stage at
// its shape and nothing but their moments, so a wrong shard changes
// nothing. A shard without moments (a pretrained checkpoint's weights)
// starts a fresh optimizer. It returns the shard's step.
func decodeShard(r *io.SectionReader, st *model.Stage, opt *optim.AdamW) (uint64, error) {
	f, err := safetensors.OpenReader(r, r.Size())
	if err != nil {
		return 0, fmt.Errorf("pipeline: shard: %w", err)
	}
	meta := f.Metadata()
	step, err := strconv.ParseUint(meta[metaStep], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pipeline: shard has no valid %s", metaStep)
	}
	adamSteps, err := strconv.Atoi(meta[metaAdamSteps])
	if err != nil || adamSteps < 0 {
		return 0, fmt.Errorf("pipeline: shard has no valid %s", metaAdamSteps)
	}
	params := st.Params()
	for _, p := range params {
		info, ok := f.Info(p.Name)
		if !ok {
			return 0, fmt.Errorf("pipeline: shard: %w: %q", safetensors.ErrMissing, p.Name)
		}
		if !slices.Equal(info.Shape, p.Shape) {
			return 0, fmt.Errorf("pipeline: shard: %w: %q is %v, the stage needs %v", safetensors.ErrShape, p.Name, info.Shape, p.Shape)
		}
	}
	var state []safetensors.TensorInfo
	for _, info := range f.Tensors() {
		if _, ok := st.Param(info.Name); ok {
			continue
		}
		name, ok := optim.IsState(info.Name)
		p, held := st.Param(name)
		if !ok || !held || !slices.Equal(info.Shape, p.Shape) {
			return 0, fmt.Errorf("pipeline: shard holds %q %v, which is no state of this stage", info.Name, info.Shape)
		}
		state = append(state, info)
	}
	// The header fits the stage: load tensor by tensor.
	opt.Reset()
	for _, p := range params {
		buf := make([]float32, p.Len())
		if err := f.ReadFloat32(p.Name, p.Shape, buf); err != nil {
			return 0, fmt.Errorf("pipeline: shard: %w", err)
		}
		if err := p.Set(buf); err != nil {
			return 0, err
		}
	}
	for _, info := range state {
		t, err := f.ReadTensor(info.Name)
		if err != nil {
			return 0, fmt.Errorf("pipeline: shard: %w", err)
		}
		if err := opt.LoadState(adamSteps, params, []model.HostTensor{model.HostTensor(t)}); err != nil {
			return 0, err
		}
	}
	if len(state) == 0 {
		if err := opt.LoadState(0, params, nil); err != nil {
			return 0, err
		}
	}
	return step, nil
}

// encodeGrads serialises the stage's accumulated gradients (for averaging
// among replicas).
func encodeGrads(st *model.Stage) ([]byte, error) {
	var ts []safetensors.Tensor
	for _, p := range st.Params() {
		ts = append(ts, safetensors.Tensor{Name: gradPrefix + p.Name, Shape: p.Shape, Data: p.GradData()})
	}
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, ts, nil); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// setGrads replaces the stage's gradients with those in b (the sum over a
// stage's replicas), checking every parameter before changing any.
func setGrads(b []byte, st *model.Stage) error {
	f, err := safetensors.OpenReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return fmt.Errorf("pipeline: gradients: %w", err)
	}
	params := st.Params()
	grads := make([][]float32, len(params))
	for i, p := range params {
		grads[i] = make([]float32, p.Len())
		if err := f.ReadFloat32(gradPrefix+p.Name, p.Shape, grads[i]); err != nil {
			return fmt.Errorf("pipeline: gradients: %w", err)
		}
	}
	for i, p := range params {
		if err := p.SetGrad(grads[i]); err != nil {
			return err
		}
	}
	return nil
}

// sumGrads adds gradient blobs of the replicas of one stage tensor by
// tensor. Every blob must hold the same tensors at the same shapes; the
// sum is taken in replica order so that it is reproducible.
func sumGrads(blobs [][]byte) ([]byte, error) {
	if len(blobs) == 0 {
		return nil, fmt.Errorf("pipeline: no gradients to sum")
	}
	files := make([]*safetensors.File, len(blobs))
	for i, b := range blobs {
		f, err := safetensors.OpenReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return nil, fmt.Errorf("pipeline: gradients of replica %d: %w", i, err)
		}
		files[i] = f
	}
	var out []safetensors.Tensor
	for _, info := range files[0].Tensors() {
		sum, err := files[0].ReadTensor(info.Name)
		if err != nil {
			return nil, err
		}
		for r := 1; r < len(files); r++ {
			other := make([]float32, len(sum.Data))
			if err := files[r].ReadFloat32(info.Name, sum.Shape, other); err != nil {
				return nil, fmt.Errorf("pipeline: gradients of replica %d: %w", r, err)
			}
			for j, v := range other {
				sum.Data[j] += v
			}
		}
		out = append(out, sum)
	}
	for r := 1; r < len(files); r++ {
		if n := len(files[r].Tensors()); n != len(out) {
			return nil, fmt.Errorf("pipeline: replica %d sent %d gradient tensors, replica 0 %d", r, n, len(out))
		}
	}
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, out, nil); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
