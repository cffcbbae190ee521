package pipeline

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/subspace"
)

// ErrNoCheckpoint is returned for a step that was not saved.
var ErrNoCheckpoint = errors.New("pipeline: no such checkpoint")

// DiskStore keeps a job's checkpoints on the researcher's disk, one
// directory per step, DIR/step-NNNNNN/: one safetensors file per stage,
// the researcher's own two, the plan, and a manifest of SHA-256 sums. A
// stage's shard is received straight into a file under Incoming and moved
// in; a checkpoint is published by an atomic rename once every file is
// whole, so a failure (a full disk) leaves the previous one intact. No
// shard is ever held in memory.
type DiskStore struct {
	Dir string

	mu     sync.Mutex
	latest int // newest step saved by this process
	ok     bool
}

// CheckpointManifest lists a checkpoint's files and their SHA-256.
type CheckpointManifest struct {
	Step    int               `json:"step"`
	JobID   string            `json:"job_id"`
	Written time.Time         `json:"written"`
	Files   map[string]string `json:"files"` // name → hex SHA-256
}

// Incoming is where shards being received are spooled: inside Dir, so
// that Save moves them in with a rename.
func (s *DiskStore) Incoming() string { return filepath.Join(s.Dir, ".incoming") }

func stepDir(dir string, step int) string { return filepath.Join(dir, fmt.Sprintf("step-%06d", step)) }

func shardName(i int) string { return fmt.Sprintf("stage-%02d.safetensors", i) }

// Save publishes checkpoint step of plan: shards are the received files of
// every stage, in stage order (moved into the checkpoint, or removed if it
// fails), own the researcher's embedding and head.
func (s *DiskStore) Save(step int, plan *job.Plan, shards []string, own [2][]byte) (err error) {
	defer func() {
		for _, f := range shards {
			os.Remove(f) // moved in, or abandoned with the checkpoint
		}
		if err != nil {
			if prev, ok := s.Latest(); ok {
				err = fmt.Errorf("%w (checkpoint %d is intact)", err, prev)
			}
		}
	}()
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.Dir, ".tmp-step-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	man := CheckpointManifest{Step: step, JobID: plan.JobID, Written: time.Now().UTC(), Files: map[string]string{}}
	for i, f := range shards {
		sum, err := fileSHA256(f)
		if err != nil {
			return err
		}
		man.Files[shardName(i)] = sum
		if err := os.Rename(f, filepath.Join(tmp, shardName(i))); err != nil {
			return err
		}
	}
	write := func(name string, b []byte) error {
		sum := sha256.Sum256(b)
		man.Files[name] = hex.EncodeToString(sum[:])
		return writeSynced(filepath.Join(tmp, name), b)
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
	if err := writeSynced(filepath.Join(tmp, "manifest.json"), mb); err != nil {
		return err
	}
	final := stepDir(s.Dir, step)
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	latest := filepath.Join(s.Dir, "latest")
	os.Remove(latest)
	_ = os.Symlink(filepath.Base(final), latest)
	s.mu.Lock()
	prev, had := s.latest, s.ok
	s.latest, s.ok = step, true
	s.mu.Unlock()
	if had && prev != step {
		os.RemoveAll(stepDir(s.Dir, prev)) // only the newest is needed to recover
	}
	return nil
}

// Latest is the newest step this store saved.
func (s *DiskStore) Latest() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest, s.ok
}

// Checkpoint is one saved step, its files checked against its manifest as
// they are opened.
type Checkpoint struct {
	Dir string
	man CheckpointManifest
}

// Open opens checkpoint step.
func (s *DiskStore) Open(step int) (*Checkpoint, error) { return OpenCheckpoint(stepDir(s.Dir, step)) }

// OpenCheckpoint reads a checkpoint directory's manifest.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	mb, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCheckpoint, err)
	}
	var man CheckpointManifest
	if err := json.Unmarshal(mb, &man); err != nil {
		return nil, fmt.Errorf("checkpoint %s: manifest: %w", dir, err)
	}
	return &Checkpoint{Dir: dir, man: man}, nil
}

// Stages is the number of stage shards.
func (c *Checkpoint) Stages() int {
	n := 0
	for ; ; n++ {
		if _, ok := c.man.Files[shardName(n)]; !ok {
			return n
		}
	}
}

// Shard opens stage i's shard after checking it against the manifest (a
// streaming pass: a corrupt file is refused before a byte is sent).
func (c *Checkpoint) Shard(i int) (*os.File, int64, error) {
	name := shardName(i)
	want, ok := c.man.Files[name]
	if !ok {
		return nil, 0, fmt.Errorf("checkpoint %s: %s not in its manifest", c.Dir, name)
	}
	path := filepath.Join(c.Dir, name)
	if sum, err := fileSHA256(path); err != nil {
		return nil, 0, err
	} else if sum != want {
		return nil, 0, fmt.Errorf("checkpoint %s: %s is corrupt (SHA-256 mismatch)", c.Dir, name)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// Own reads the researcher's embedding and head shards.
func (c *Checkpoint) Own() ([2][]byte, error) {
	var own [2][]byte
	for i, name := range []string{"researcher-embed.safetensors", "researcher-head.safetensors"} {
		b, err := os.ReadFile(filepath.Join(c.Dir, name))
		if err != nil {
			return own, err
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != c.man.Files[name] {
			return own, fmt.Errorf("checkpoint %s: %s is corrupt (SHA-256 mismatch)", c.Dir, name)
		}
		own[i] = b
	}
	return own, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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

// NewPermutation draws the permutation of vocab ids that secret (at
// least 16 random bytes; NewSecret gives 32) keys: a Fisher–Yates shuffle
// driven by ChaCha8 keyed with SHA-256 of the secret, so recovering the
// substitution from its structure means breaking a 256-bit keyed stream
// (the first version's generator had 64 bits of state).
func NewPermutation(vocab int, secret []byte) (*Permutation, error) {
	if vocab <= 0 || len(secret) < 16 {
		return nil, errors.New("pipeline: a permutation needs a vocabulary and a secret of at least 16 bytes")
	}
	key := sha256.Sum256(append([]byte("holopeer-token-pseudonyms-v2:"), secret...))
	r := mrand.New(mrand.NewChaCha8(key))
	p := &Permutation{fwd: make([]int32, vocab), inv: make([]int32, vocab)}
	for i := range p.fwd {
		p.fwd[i] = int32(i)
	}
	for i := vocab - 1; i > 0; i-- {
		j := r.IntN(i + 1)
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

// realRows writes to dst the rows of src (one per pseudonym, cols wide)
// in real token order: dst row t is src row Apply(t).
func (p *Permutation) realRows(dst, src []float32, cols int) {
	for t, ps := range p.fwd {
		copy(dst[t*cols:(t+1)*cols], src[int(ps)*cols:(int(ps)+1)*cols])
	}
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

// AssembleStages rebuilds the whole model from the store's latest
// checkpoint of plan p, on the cpu backend: the researcher's embedding
// stage, every block stage, and its head stage, in order, with their
// optimizers. The caller closes the stages. It reads the researcher's own
// checkpoint files, never a stage node.
func AssembleStages(store *DiskStore, p *job.Plan) ([]*model.Stage, []*optim.AdamW, error) {
	step, ok := store.Latest()
	if !ok {
		step = int(p.Spec.Steps)
	}
	c, err := store.Open(step)
	if err != nil {
		return nil, nil, err
	}
	if n := c.Stages(); n != len(p.Stages) {
		return nil, nil, fmt.Errorf("pipeline: checkpoint has %d stage shards, the plan %d stages", n, len(p.Stages))
	}
	own, err := c.Own()
	if err != nil {
		return nil, nil, err
	}
	cfg, L := p.Spec.Model, p.Spec.Model.Layers
	spans := []model.Span{{First: 0, Last: 0, Embed: true}}
	for _, s := range p.Stages {
		spans = append(spans, model.Span{First: s.First, Last: s.Last})
	}
	spans = append(spans, model.Span{First: L, Last: L, Head: true})
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
		switch {
		case i == 0:
			_, err = decodeShard(bytesReader(own[0]), st, opt)
		case i == len(spans)-1:
			_, err = decodeShard(bytesReader(own[1]), st, opt)
		default:
			var f *os.File
			var size int64
			if f, size, err = c.Shard(i - 1); err == nil {
				_, err = decodeShard(io.NewSectionReader(f, 0, size), st, opt)
				f.Close()
			}
		}
		if err != nil {
			return fail(fmt.Errorf("stage %d: %w", i, err))
		}
		opts = append(opts, opt)
	}
	return stages, opts, nil
}

// Export is the final model of a run as sources that read each tensor
// from the researcher's checkpoint files on disk only when a writer
// reaches it (checkpoint.SaveSources): the model is exported without the
// researcher holding any stage whole. Dense holds the Hugging Face tensors
// (a constrained model's projections densified as W = U·Z and its
// embedding as Z·Uᵀ + E_fix, one tensor at a time; with pseudonyms the
// embedding and head rows back in real token order); Factors holds a
// constrained model's stored factors as trained (pseudonym order, which
// serving them through the swarm again needs with the same secret).
type Export struct {
	Dense, Factors []safetensors.Source
	files          []*os.File
}

// Close releases the shard files.
func (e *Export) Close() error {
	var errs []error
	for _, f := range e.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// ExportSources opens the store's latest checkpoint of plan p for export;
// perm is the run's pseudonyms (nil without). A tied weight is listed once.
func ExportSources(store *DiskStore, p *job.Plan, perm *Permutation) (*Export, error) {
	cfg := p.Spec.Model
	step, ok := store.Latest()
	if !ok {
		step = int(p.Spec.Steps)
	}
	c, err := store.Open(step)
	if err != nil {
		return nil, err
	}
	if n := c.Stages(); n != len(p.Stages) {
		return nil, fmt.Errorf("pipeline: checkpoint has %d stage shards, the plan %d stages", n, len(p.Stages))
	}
	own, err := c.Own()
	if err != nil {
		return nil, err
	}
	var basis *subspace.Basis
	if bc, ok := cfg.Basis(); ok {
		if basis, err = subspace.New(bc); err != nil {
			return nil, err
		}
	}
	e := &Export{}
	seen := map[string]bool{}
	add := func(r *io.SectionReader, span model.Span) error {
		f, err := safetensors.OpenReader(r, r.Size())
		if err != nil {
			return err
		}
		for _, ref := range checkpoint.StageTensors(cfg, span) {
			if seen[ref.Name] {
				continue
			}
			seen[ref.Name] = true
			info, ok := f.Info(ref.Name)
			if !ok || !slices.Equal(info.Shape, ref.Shape) {
				return fmt.Errorf("pipeline: shard of blocks %d-%d lacks %s%v", span.First, span.Last-1, ref.Name, ref.Shape)
			}
			read := func() (model.HostTensor, error) {
				t := model.HostTensor{Name: ref.Name, Shape: ref.Shape, Data: make([]float32, info.NumElements())}
				return t, f.ReadFloat32(ref.Name, ref.Shape, t.Data)
			}
			dense := safetensors.Source{Name: ref.Name, Shape: ref.Shape, Read: func(dst []float32) error {
				return f.ReadFloat32(ref.Name, ref.Shape, dst)
			}}
			if strings.HasSuffix(ref.Name, ".z") {
				e.Factors = append(e.Factors, dense)
				convert := model.DenseProjection
				name, shape := strings.TrimSuffix(ref.Name, ".z")+".weight", []int{cfg.Dim, ref.Shape[1]}
				if ref.Name == model.NameEmbedZ {
					convert = model.DenseEmbedding
					name, shape = model.NameEmbed, []int{ref.Shape[0], cfg.Dim}
				}
				dense = safetensors.Source{Name: name, Shape: shape, Read: func(dst []float32) error {
					z, err := read()
					if err != nil {
						return err
					}
					copy(dst, convert(basis, z).Data)
					return nil
				}}
			}
			if perm != nil && (dense.Name == model.NameEmbed || dense.Name == model.NameHead) {
				inner := dense.Read
				cols := dense.Shape[1]
				dense.Read = func(dst []float32) error {
					pseudo := make([]float32, len(dst))
					if err := inner(pseudo); err != nil {
						return err
					}
					perm.realRows(dst, pseudo, cols)
					return nil
				}
			}
			e.Dense = append(e.Dense, dense)
		}
		return nil
	}
	fail := func(err error) (*Export, error) {
		e.Close()
		return nil, err
	}
	if err := add(bytesReader(own[0]), model.Span{Embed: true}); err != nil {
		return fail(fmt.Errorf("embedding: %w", err))
	}
	for i, s := range p.Stages {
		f, size, err := c.Shard(i)
		if err != nil {
			return fail(err)
		}
		e.files = append(e.files, f)
		if err := add(io.NewSectionReader(f, 0, size), model.Span{First: s.First, Last: s.Last}); err != nil {
			return fail(fmt.Errorf("stage %d: %w", i, err))
		}
	}
	L := cfg.Layers
	if err := add(bytesReader(own[1]), model.Span{First: L, Last: L, Head: true}); err != nil {
		return fail(fmt.Errorf("head: %w", err))
	}
	return e, nil
}
