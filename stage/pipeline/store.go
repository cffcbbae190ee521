package pipeline

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
)

// CheckpointStore keeps the shards the driver collects at each checkpoint.
// Load returns those of a step Save stored (the latest is enough for
// recovery).
type CheckpointStore interface {
	Save(step int, plan *job.Plan, shards [][]byte, own [2][]byte) error
	Load(step int) (shards [][]byte, own [2][]byte, err error)
}

// ErrNoCheckpoint is returned by Load for a step that was not saved.
var ErrNoCheckpoint = errors.New("pipeline: no such checkpoint")

// MemoryStore keeps the latest checkpoint in memory.
type MemoryStore struct {
	mu     sync.Mutex
	step   int
	shards [][]byte
	own    [2][]byte
	ok     bool
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

func (m *MemoryStore) Save(step int, _ *job.Plan, shards [][]byte, own [2][]byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.step, m.shards, m.own, m.ok = step, shards, own, true
	return nil
}

func (m *MemoryStore) Load(step int) ([][]byte, [2][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if step == 0 && (!m.ok || m.step != 0) {
		return nil, [2][]byte{}, nil // the seed: stages re-initialise
	}
	if !m.ok || m.step != step {
		return nil, [2][]byte{}, fmt.Errorf("%w: step %d", ErrNoCheckpoint, step)
	}
	return m.shards, m.own, nil
}

// DiskStore writes each checkpoint to DIR/step-NNNNNN/ (one safetensors
// file per stage, the researcher's own two, the plan, and a manifest of
// SHA-256 sums), published by an atomic rename, and keeps the latest in
// memory for fast recovery.
type DiskStore struct {
	Dir string
	mem MemoryStore
}

// CheckpointManifest lists a checkpoint's files and their SHA-256.
type CheckpointManifest struct {
	Step    int               `json:"step"`
	JobID   string            `json:"job_id"`
	Written time.Time         `json:"written"`
	Files   map[string]string `json:"files"` // name → hex SHA-256
}

func (s *DiskStore) Save(step int, plan *job.Plan, shards [][]byte, own [2][]byte) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	final := filepath.Join(s.Dir, fmt.Sprintf("step-%06d", step))
	tmp, err := os.MkdirTemp(s.Dir, ".tmp-step-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	man := CheckpointManifest{Step: step, JobID: plan.JobID, Written: time.Now().UTC(), Files: map[string]string{}}
	write := func(name string, b []byte) error {
		sum := sha256.Sum256(b)
		man.Files[name] = hex.EncodeToString(sum[:])
		return os.WriteFile(filepath.Join(tmp, name), b, 0o600)
	}
	for i, b := range shards {
		if err := write(fmt.Sprintf("stage-%02d.safetensors", i), b); err != nil {
			return err
		}
	}
	if err := write("researcher-embed.safetensors", own[0]); err != nil {
		return err
	}
	if err := write("researcher-head.safetensors", own[1]); err != nil {
		return err
	}
	pb, _ := json.MarshalIndent(plan, "", "  ")
	if err := write("plan.json", pb); err != nil {
		return err
	}
	mb, _ := json.MarshalIndent(man, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), mb, 0o600); err != nil {
		return err
	}
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	latest := filepath.Join(s.Dir, "latest")
	os.Remove(latest)
	_ = os.Symlink(filepath.Base(final), latest)
	return s.mem.Save(step, plan, shards, own)
}

func (s *DiskStore) Load(step int) ([][]byte, [2][]byte, error) {
	if sh, own, err := s.mem.Load(step); err == nil {
		return sh, own, nil
	}
	return ReadCheckpoint(filepath.Join(s.Dir, fmt.Sprintf("step-%06d", step)))
}

// ReadCheckpoint loads a checkpoint directory, checking every file against
// its manifest.
func ReadCheckpoint(dir string) ([][]byte, [2][]byte, error) {
	var own [2][]byte
	mb, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, own, fmt.Errorf("%w: %v", ErrNoCheckpoint, err)
	}
	var man CheckpointManifest
	if err := json.Unmarshal(mb, &man); err != nil {
		return nil, own, fmt.Errorf("checkpoint %s: manifest: %w", dir, err)
	}
	read := func(name string) ([]byte, error) {
		want, ok := man.Files[name]
		if !ok {
			return nil, fmt.Errorf("checkpoint %s: %s not in its manifest", dir, name)
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != want {
			return nil, fmt.Errorf("checkpoint %s: %s is corrupt (SHA-256 mismatch)", dir, name)
		}
		return b, nil
	}
	var shards [][]byte
	for i := 0; ; i++ {
		name := fmt.Sprintf("stage-%02d.safetensors", i)
		if _, ok := man.Files[name]; !ok {
			break
		}
		b, err := read(name)
		if err != nil {
			return nil, own, err
		}
		shards = append(shards, b)
	}
	if own[0], err = read("researcher-embed.safetensors"); err != nil {
		return nil, own, err
	}
	if own[1], err = read("researcher-head.safetensors"); err != nil {
		return nil, own, err
	}
	return shards, own, nil
}

// Permutation pseudonymises token ids. A subspace job sends every stage
// the ids of its tokens (each stage rebuilds E_fix[id]); under a secret
// permutation a stage sees only consistent pseudonyms, which tell it no
// more than the first stage's input activations already do. The model is
// trained in pseudonym space: embedding rows, head rows and targets all
// use the permuted ids, and generation maps back with Invert.
type Permutation struct {
	fwd, inv []int32
}

// NewPermutation draws a random permutation of vocab ids from secret (32
// random bytes: the researcher keeps them with its checkpoints).
func NewPermutation(vocab int, secret []byte) (*Permutation, error) {
	if vocab <= 0 || len(secret) < 16 {
		return nil, errors.New("pipeline: a permutation needs a vocabulary and a secret of at least 16 bytes")
	}
	h := sha256.Sum256(append([]byte("holopeer-token-pseudonyms-v1:"), secret...))
	state := binary.LittleEndian.Uint64(h[:8]) ^ binary.LittleEndian.Uint64(h[8:16])
	p := &Permutation{fwd: make([]int32, vocab), inv: make([]int32, vocab)}
	for i := range p.fwd {
		p.fwd[i] = int32(i)
	}
	for i := vocab - 1; i > 0; i-- {
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		j := int(z % uint64(i+1))
		p.fwd[i], p.fwd[j] = p.fwd[j], p.fwd[i]
	}
	for i, v := range p.fwd {
		p.inv[v] = int32(i)
	}
	return p, nil
}

// NewSecret returns 32 random bytes for NewPermutation.
func NewSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}

// Apply maps real ids to pseudonyms (negative ids, "ignore", stay).
func (p *Permutation) Apply(ids []int32) []int32 { return p.mapIDs(ids, p.fwd) }

// Invert maps pseudonyms back to real ids.
func (p *Permutation) Invert(ids []int32) []int32 { return p.mapIDs(ids, p.inv) }

func (p *Permutation) mapIDs(ids []int32, table []int32) []int32 {
	out := make([]int32, len(ids))
	for i, v := range ids {
		if v < 0 || int(v) >= len(table) {
			out[i] = v
			continue
		}
		out[i] = table[v]
	}
	return out
}

// AssembleStages rebuilds the whole model from a store's latest
// checkpoint of plan p, on the cpu backend: the researcher's embedding
// stage, every block stage, and its head stage, in order, with their
// optimizers. The caller closes the stages. It is how the researcher
// writes the final model; the blocks come from the researcher's own
// checkpoint files, never from a stage node.
func AssembleStages(store CheckpointStore, p *job.Plan) ([]*model.Stage, []*optim.AdamW, error) {
	step := int(p.Spec.Steps)
	if ds, ok := store.(*DiskStore); ok {
		ds.mem.mu.Lock()
		if ds.mem.ok {
			step = ds.mem.step
		}
		ds.mem.mu.Unlock()
	}
	shards, own, err := store.Load(step)
	if err != nil {
		return nil, nil, err
	}
	if len(shards) != len(p.Stages) {
		return nil, nil, fmt.Errorf("pipeline: checkpoint has %d stage shards, the plan %d stages", len(shards), len(p.Stages))
	}
	cfg, L := p.Spec.Model, p.Spec.Model.Layers
	spans := []model.Span{{First: 0, Last: 0, Embed: true}}
	blobs := [][]byte{own[0]}
	for i, s := range p.Stages {
		spans = append(spans, model.Span{First: s.First, Last: s.Last})
		blobs = append(blobs, shards[i])
	}
	spans = append(spans, model.Span{First: L, Last: L, Head: true})
	blobs = append(blobs, own[1])
	var stages []*model.Stage
	var opts []*optim.AdamW
	fail := func(err error) ([]*model.Stage, []*optim.AdamW, error) {
		for _, s := range stages {
			s.Close()
		}
		return nil, nil, err
	}
	for i, sp := range spans {
		st, err := model.NewStage(cfg, sp, model.WithSeed(p.Spec.InitSeed))
		if err != nil {
			return fail(err)
		}
		stages = append(stages, st)
		opt, err := optim.New(st.Backend(), p.Spec.Optim)
		if err != nil {
			return fail(err)
		}
		if _, err := decodeShard(blobs[i], st, opt); err != nil {
			return fail(fmt.Errorf("stage %d: %w", i, err))
		}
		opts = append(opts, opt)
	}
	return stages, opts, nil
}
