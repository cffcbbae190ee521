package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/holopeer/holopeer/stage/safetensors"
)

// ModelIndexFile is the index of a sharded checkpoint (transformers writes
// one when the weights exceed its shard size): {"weight_map": {tensor name:
// shard file name}}.
const ModelIndexFile = "model.safetensors.index.json"

// Limits on an index: real ones name a few thousand tensors in a few
// dozen shards.
const (
	maxIndexBytes = 64 << 20
	maxShards     = 4096
)

// shards reads the tensors of a sharded checkpoint, each from the shard
// the index names; only the shards' headers are read when it opens.
type shards struct {
	files map[string]*safetensors.File // by shard file name
	where map[string]*safetensors.File // by tensor name
}

func openShards(dir string) (*shards, error) {
	b, err := readBounded(filepath.Join(dir, ModelIndexFile), maxIndexBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, ModelIndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%w: %s has no weight_map", ErrConfig, ModelIndexFile)
	}
	s := &shards{files: map[string]*safetensors.File{}, where: map[string]*safetensors.File{}}
	// Open shards in name order, so errors are reproducible.
	for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
		shard := idx.WeightMap[name]
		// A shard is a file beside the index, never a path elsewhere.
		if shard == "" || shard != filepath.Base(shard) || strings.ContainsAny(shard, `/\`) || shard == "." || shard == ".." {
			s.Close()
			return nil, fmt.Errorf("%w: %s: tensor %q is mapped to %q, which is not a file name in the checkpoint directory", ErrConfig, ModelIndexFile, name, shard)
		}
		f, ok := s.files[shard]
		if !ok {
			if len(s.files) == maxShards {
				s.Close()
				return nil, fmt.Errorf("%w: %s names more than %d shards", ErrConfig, ModelIndexFile, maxShards)
			}
			if f, err = safetensors.Open(filepath.Join(dir, shard)); err != nil {
				s.Close()
				return nil, err
			}
			s.files[shard] = f
		}
		s.where[name] = f
	}
	return s, nil
}

func (s *shards) Info(name string) (safetensors.TensorInfo, bool) {
	f, ok := s.where[name]
	if !ok {
		return safetensors.TensorInfo{}, false
	}
	return f.Info(name)
}

func (s *shards) ReadFloat32(name string, shape []int, dst []float32) error {
	f, ok := s.where[name]
	if !ok {
		return fmt.Errorf("%w: %q is not in %s", safetensors.ErrMissing, name, ModelIndexFile)
	}
	return f.ReadFloat32(name, shape, dst)
}

func (s *shards) ReadFloat32At(name string, shape []int, off int64, dst []float32) error {
	f, ok := s.where[name]
	if !ok {
		return fmt.Errorf("%w: %q is not in %s", safetensors.ErrMissing, name, ModelIndexFile)
	}
	return f.ReadFloat32At(name, shape, off, dst)
}

func (s *shards) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}
