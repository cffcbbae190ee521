package model

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/tensor"
	_ "github.com/holopeer/holopeer/stage/tensor/cpu" // the default backend
)

// Errors a Stage returns, wrapped with detail.
var (
	// ErrInput: an input or gradient has the wrong shape or bad values.
	ErrInput = errors.New("model: bad input")
	// ErrUnknownMicrobatch: Backward for a microbatch with no saved forward.
	ErrUnknownMicrobatch = errors.New("model: unknown microbatch")
	// ErrMicrobatchBusy: Forward for a microbatch whose backward is pending.
	ErrMicrobatchBusy = errors.New("model: microbatch already in flight")
	// ErrContextFull: a KV cache would grow past MaxSeq.
	ErrContextFull = errors.New("model: context full")
)

// Span is the part of a model a stage holds.
type Span struct {
	First, Last int  // blocks [First, Last)
	Embed       bool // owns the token embedding (the first stage)
	Head        bool // owns the final norm, LM head and loss (the last stage)
}

// Whole is the span of an uncut model.
func Whole(cfg Config) Span { return Span{First: 0, Last: cfg.Layers, Embed: true, Head: true} }

func (s Span) validate(c Config) error {
	switch {
	case s.First < 0 || s.Last < s.First || s.Last > c.Layers:
		return fmt.Errorf("%w: span blocks [%d,%d) outside 0..%d", ErrConfig, s.First, s.Last, c.Layers)
	case s.First == s.Last && !s.Embed && !s.Head:
		return fmt.Errorf("%w: span [%d,%d) holds nothing", ErrConfig, s.First, s.Last)
	case s.Embed && s.First != 0:
		return fmt.Errorf("%w: the embedding stage must start at block 0, not %d", ErrConfig, s.First)
	case s.Head && s.Last != c.Layers:
		return fmt.Errorf("%w: the head stage must end at block %d, not %d", ErrConfig, c.Layers, s.Last)
	}
	return nil
}

type options struct {
	be     tensor.Backend
	seed   uint64
	noGrad bool
	load   Loader
	wdt    tensor.DType
	set    map[string]bool
}

// Option configures NewStage.
type Option func(*options) error

func once(o *options, name string) error {
	if o.set[name] {
		return fmt.Errorf("model: option %s given twice", name)
	}
	o.set[name] = true
	return nil
}

// WithBackend runs the stage on be (default: the "cpu" backend).
func WithBackend(be tensor.Backend) Option {
	return func(o *options) error {
		if be == nil {
			return errors.New("model: nil backend")
		}
		o.be = be
		return once(o, "WithBackend")
	}
}

// WithSeed sets the initialisation seed (default 0). Every stage of one
// model must use the same seed: a parameter's initial value depends only
// on the seed and its name.
func WithSeed(seed uint64) Option {
	return func(o *options) error {
		o.seed = seed
		return once(o, "WithSeed")
	}
}

// WithoutGrad builds a stage for inference only: it allocates no gradient
// buffers, so a serving stage holds its weights and nothing else, and it
// refuses a training forward pass.
func WithoutGrad() Option {
	return func(o *options) error {
		o.noGrad = true
		return once(o, "WithoutGrad")
	}
}

// Loader fills dst with elements [off, off+len(dst)) of the named
// parameter (row-major, of the given shape) from a checkpoint or a stream.
type Loader func(name string, shape []int, off int, dst []float32) error

// loadSlice is the most values NewStage asks a Loader for at once: the
// host buffer a load needs, whatever the size of the largest tensor.
const loadSlice = 1 << 20

// WithValues fills each parameter from load instead of the seed's
// initialisation, a bounded slice at a time: no random values are drawn
// only to be overwritten, and besides the stage itself the host holds one
// slice of at most 4 MiB. The values must be finite.
func WithValues(load Loader) Option {
	return func(o *options) error {
		if load == nil {
			return errors.New("model: nil value loader")
		}
		o.load = load
		return once(o, "WithValues")
	}
}

// WithWeightDType stores the stage's matrices (every 2-D parameter: the
// projections, the embedding and the head) as dt when the stage is built
// WithoutGrad and its backend supports dt; norm gains and everything a
// training stage holds stay float32, since the optimizer needs float32
// master weights. tensor.BFloat16 keeps a bfloat16 checkpoint at 2 bytes
// per parameter in memory: the values are exact, and the GEMM widens them
// as it reads them.
func WithWeightDType(dt tensor.DType) Option {
	return func(o *options) error {
		if dt != tensor.Float32 && dt != tensor.BFloat16 {
			return fmt.Errorf("model: weight dtype %v (float32 or bfloat16)", dt)
		}
		o.wdt = dt
		return once(o, "WithWeightDType")
	}
}

// ErrNoGrad is returned by a training call on a stage built WithoutGrad.
var ErrNoGrad = errors.New("model: the stage was built without gradients (inference only)")

// Stage is a contiguous piece of the model: some blocks, and the embedding
// and/or head if its span says so. It is not safe for concurrent use; a
// pipeline gives each stage one owner goroutine (stages sharing a backend
// may run concurrently).
type Stage struct {
	cfg   Config // with defaults filled
	span  Span
	be    tensor.Backend
	basis *subspace.Basis // nil without the subspace constraint
	u     tensor.Buffer   // U on the device, d×k
	freq  tensor.Buffer   // rotary inverse frequencies, HeadDim/2

	params []*Param
	byName map[string]*Param

	embed     *Param // NameEmbed or NameEmbedZ
	blocks    []*block
	finalNorm *Param
	head      *Param

	saved  map[int]*microbatch
	noGrad bool         // built WithoutGrad: inference only
	wdt    tensor.DType // how the matrices are stored
}

type block struct {
	index       int
	constrained bool
	attnNorm    *Param
	q, k, v, o  *Param
	mlpNorm     *Param
	gate, up    *Param
	down        *Param
}

// NewStage builds the stage of cfg covering span, initialised from the seed.
func NewStage(cfg Config, span Span, opts ...Option) (*Stage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := span.validate(cfg); err != nil {
		return nil, err
	}
	o := options{set: map[string]bool{}}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.be == nil {
		be, err := tensor.Open("cpu")
		if err != nil {
			return nil, err
		}
		o.be = be
	}
	s := &Stage{cfg: cfg, span: span, be: o.be, noGrad: o.noGrad, byName: map[string]*Param{}, saved: map[int]*microbatch{}}
	s.freq = s.be.Alloc(tensor.Float32, cfg.HeadDim()/2)
	s.be.Upload(s.freq, RopeInvFreq(cfg))
	if bc, ok := cfg.Basis(); ok {
		b, err := subspace.New(bc)
		if err != nil {
			return nil, fmt.Errorf("model: subspace basis: %w", err)
		}
		s.basis = b
		s.u = s.be.Alloc(tensor.Float32, len(b.U()))
		s.be.Upload(s.u, b.U())
	}
	wdt := tensor.Float32
	if o.wdt == tensor.BFloat16 && o.noGrad && tensor.Supports(s.be, tensor.BFloat16) {
		wdt = tensor.BFloat16
	}
	s.wdt = wdt
	var scratch []float32 // one host buffer for every loaded slice
	for _, spec := range cfg.paramSpecs(span) {
		dt := tensor.Float32
		if len(spec.shape) == 2 {
			dt = wdt
		}
		p := &Param{
			Name:  spec.name,
			Shape: spec.shape,
			Value: s.be.Alloc(dt, spec.size()),
			Decay: spec.decay,
			Tied:  spec.tied,
			be:    s.be,
		}
		if !o.noGrad {
			p.Grad = s.be.Alloc(tensor.Float32, spec.size())
		}
		s.params = append(s.params, p)
		s.byName[p.Name] = p
		if err := s.fill(o, spec, p.Value, &scratch); err != nil {
			s.Close()
			return nil, err
		}
	}
	get := func(name string) *Param { return s.byName[name] }
	if span.Embed {
		s.embed = get(NameEmbed)
		if s.basis != nil {
			s.embed = get(NameEmbedZ)
		}
	}
	for i := span.First; i < span.Last; i++ {
		ln := func(suffix string) *Param { return get(LayerName(i, suffix)) }
		b := &block{
			index:       i,
			constrained: cfg.Constrained(i),
			attnNorm:    ln("input_layernorm.weight"),
			q:           ln("self_attn.q_proj.weight"),
			k:           ln("self_attn.k_proj.weight"),
			v:           ln("self_attn.v_proj.weight"),
			o:           ln("self_attn.o_proj.weight"),
			mlpNorm:     ln("post_attention_layernorm.weight"),
			gate:        ln("mlp.gate_proj.weight"),
			up:          ln("mlp.up_proj.weight"),
			down:        ln("mlp.down_proj.weight"),
		}
		if b.constrained {
			b.o, b.down = ln("self_attn.o_proj.z"), ln("mlp.down_proj.z")
		}
		s.blocks = append(s.blocks, b)
	}
	if span.Head {
		s.finalNorm = get(NameFinalNorm)
		s.head = get(NameHead)
		if cfg.TieEmbeddings {
			s.head = get(NameEmbed)
		}
	}
	// Every tensor the stage uses must exist (catches a spec/wiring mismatch).
	for _, b := range s.blocks {
		for _, p := range []*Param{b.attnNorm, b.q, b.k, b.v, b.o, b.mlpNorm, b.gate, b.up, b.down} {
			if p == nil {
				return nil, fmt.Errorf("model: block %d lacks a parameter", b.index)
			}
		}
	}
	if (span.Embed && s.embed == nil) || (span.Head && (s.finalNorm == nil || s.head == nil)) {
		return nil, errors.New("model: embedding or head parameters missing")
	}
	return s, nil
}

// fill sets a parameter's starting value: from the loader when one is
// given, slice by slice (each checked finite), else from the seed.
func (s *Stage) fill(o options, spec paramSpec, dst tensor.Buffer, scratch *[]float32) error {
	if o.load == nil {
		s.be.Upload(dst, initValues(o.seed, spec))
		return nil
	}
	n := spec.size()
	if cap(*scratch) < min(n, loadSlice) {
		*scratch = make([]float32, min(n, loadSlice))
	}
	for off := 0; off < n; off += loadSlice {
		vals := (*scratch)[:min(loadSlice, n-off)]
		if err := o.load(spec.name, spec.shape, off, vals); err != nil {
			return fmt.Errorf("model: %s: %w", spec.name, err)
		}
		for i, v := range vals {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("model: %s holds a non-finite value (%v) at element %d", spec.name, v, off+i)
			}
		}
		if off == 0 && len(vals) == n {
			s.be.Upload(dst, vals)
		} else {
			s.be.Upload(s.be.View(dst, off, len(vals)), vals)
		}
	}
	return nil
}

// WeightDType is how the stage stores its matrices (WithWeightDType).
func (s *Stage) WeightDType() tensor.DType { return s.wdt }

// Trainable reports whether the stage has gradient buffers.
func (s *Stage) Trainable() bool { return !s.noGrad }

// Config returns the model config, defaults filled in.
func (s *Stage) Config() Config { return s.cfg }

// Span returns what the stage holds.
func (s *Stage) Span() Span { return s.span }

// Backend returns the device the stage runs on.
func (s *Stage) Backend() tensor.Backend { return s.be }

// Basis returns the subspace basis, or nil without the constraint. The wire
// codec must use this same basis.
func (s *Stage) Basis() *subspace.Basis { return s.basis }

// Params lists the stage's parameters: embedding, blocks in order (each in
// Hugging Face order), final norm, head.
func (s *Stage) Params() []*Param { return slices.Clone(s.params) }

// Param returns the parameter with the given name.
func (s *Stage) Param(name string) (*Param, bool) {
	p, ok := s.byName[name]
	return p, ok
}

// ZeroGrad clears every accumulated gradient.
func (s *Stage) ZeroGrad() {
	if s.noGrad {
		return
	}
	for _, p := range s.params {
		s.be.Fill(p.Grad, 0)
	}
}

// InFlight lists the microbatches whose backward is pending, ascending.
func (s *Stage) InFlight() []int {
	ids := make([]int, 0, len(s.saved))
	for id := range s.saved {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Drop discards a microbatch's saved activations (an aborted step).
func (s *Stage) Drop(mb int) {
	if run, ok := s.saved[mb]; ok {
		run.free(s.be)
		delete(s.saved, mb)
	}
}

// Close frees every buffer the stage holds. The stage is unusable after.
func (s *Stage) Close() {
	for _, mb := range s.InFlight() {
		s.Drop(mb)
	}
	for _, p := range s.params {
		s.be.Free(p.Value)
		if p.Grad != nil {
			s.be.Free(p.Grad)
		}
	}
	if s.u != nil {
		s.be.Free(s.u)
	}
	s.be.Free(s.freq)
	s.params, s.byName = nil, nil
}

// Input is one microbatch entering a stage: Batch sequences of Seq tokens,
// N = Batch·Seq rows, row b·Seq+i being token i of sequence b. Attention is
// causal within each sequence.
type Input struct {
	Batch, Seq int

	// Tokens are the N token ids (< Vocab). Required by the first stage;
	// other stages use them, when given, only to measure the subspace
	// invariant of their output.
	Tokens []int32
	// Positions are the N rotary positions (< MaxSeq); nil means 0..Seq−1
	// in every sequence. Every stage applies RoPE, so every stage needs the
	// same positions.
	Positions []int32
	// Hidden is the N×d input of a stage without the embedding.
	Hidden []float32
	// Targets are the N labels of the last stage (< Vocab; negative means
	// ignore). Training the last stage requires them.
	Targets []int32
	// LossTokens normalises the loss: the number of non-ignored targets in
	// the whole global batch, all microbatches together, so that the
	// microbatches' losses and gradients sum to the batch mean. 0 means
	// this microbatch's own count.
	LossTokens int
	// NoGrad runs forward only (evaluation): nothing is saved.
	NoGrad bool
}

// Output is what a forward produces.
type Output struct {
	// Hidden is the N×d output of a stage without the head.
	Hidden []float32
	// Logits are the N×Vocab logits of the head stage when no targets
	// were given.
	Logits []float32
	// Loss is ΣNLL/LossTokens: this microbatch's share of the batch mean.
	Loss float64
	// LossSum is ΣNLL over this microbatch's non-ignored targets.
	LossSum float64
	// Targets counts this microbatch's non-ignored targets.
	Targets int
	// SubspaceResidual is ‖(I−UUᵀ)(h−E_fix)‖/‖h−E_fix‖ of Hidden, the
	// invariant monitor (≈1e-6 when the constraint holds); negative when
	// not measured (no constraint, no tokens, or the head stage).
	SubspaceResidual float64
}

type mode int

const (
	modeTrain mode = iota
	modeEval
	modeInfer
)

// check validates an input completely before any compute.
func (s *Stage) check(in Input, m mode) error {
	c := s.cfg
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInput, fmt.Sprintf(format, a...))
	}
	if in.Batch <= 0 || in.Seq <= 0 {
		return bad("batch %d × seq %d must be positive", in.Batch, in.Seq)
	}
	if in.Seq > c.MaxSeq {
		return bad("seq %d exceeds MaxSeq %d", in.Seq, c.MaxSeq)
	}
	if in.Batch > MaxSeqLen {
		return bad("batch %d too large", in.Batch)
	}
	n := in.Batch * in.Seq
	if s.span.Embed {
		if len(in.Tokens) != n {
			return bad("first stage needs %d token ids, got %d", n, len(in.Tokens))
		}
		if len(in.Hidden) != 0 {
			return bad("first stage takes tokens, not hidden states")
		}
	} else {
		if len(in.Hidden) != n*c.Dim {
			return bad("hidden states: %d values, want %d×%d", len(in.Hidden), n, c.Dim)
		}
		for i, v := range in.Hidden {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return bad("hidden state %d (token %d) is not finite", i, i/c.Dim)
			}
		}
		if len(in.Tokens) != 0 && len(in.Tokens) != n {
			return bad("%d token ids for %d tokens", len(in.Tokens), n)
		}
	}
	for i, t := range in.Tokens {
		if t < 0 || int(t) >= c.Vocab {
			return bad("token %d at %d outside vocab %d", t, i, c.Vocab)
		}
	}
	if m != modeInfer {
		if len(in.Positions) != 0 && len(in.Positions) != n {
			return bad("%d positions for %d tokens", len(in.Positions), n)
		}
		for i, p := range in.Positions {
			if p < 0 || int(p) >= c.MaxSeq {
				return bad("position %d at %d outside 0..%d", p, i, c.MaxSeq-1)
			}
		}
	}
	if len(in.Targets) != 0 {
		if !s.span.Head {
			return bad("targets given to a stage without the head")
		}
		if m == modeInfer {
			return bad("inference takes no targets")
		}
		if len(in.Targets) != n {
			return bad("%d targets for %d tokens", len(in.Targets), n)
		}
		for i, t := range in.Targets {
			if int(t) >= c.Vocab {
				return bad("target %d at %d outside vocab %d", t, i, c.Vocab)
			}
		}
	} else if s.span.Head && m == modeTrain {
		return bad("training the head stage needs targets (set NoGrad to evaluate)")
	}
	if in.LossTokens < 0 {
		return bad("LossTokens %d is negative", in.LossTokens)
	}
	return nil
}

// microbatch is what a forward saved for the backward.
type microbatch struct {
	n      int
	shape  tensor.AttnShape
	pos    tensor.Buffer
	tokens tensor.Buffer // the first stage's ids, for the embedding backward
	acts   []*blockActs
	// head stage
	hFinal, rstdFinal, dlogits tensor.Buffer
}

func (m *microbatch) free(be tensor.Backend) {
	for _, a := range m.acts {
		a.free(be)
	}
	for _, b := range []tensor.Buffer{m.pos, m.tokens, m.hFinal, m.rstdFinal, m.dlogits} {
		if b != nil {
			be.Free(b)
		}
	}
	*m = microbatch{}
}

func (s *Stage) alloc(n int) tensor.Buffer { return s.be.Alloc(tensor.Float32, n) }

func (s *Stage) attnShape(batch, seqQ, seqK, past int) tensor.AttnShape {
	c := s.cfg
	return tensor.AttnShape{
		Batch: batch, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim(),
		SeqQ: seqQ, SeqK: seqK, QOffset: past,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim()))),
	}
}

// Forward runs microbatch mb through the stage. Unless in.NoGrad, it keeps
// what Backward(mb) needs until that call.
func (s *Stage) Forward(mb int, in Input) (Output, error) {
	m := modeTrain
	if in.NoGrad {
		m = modeEval
	}
	if m == modeTrain && s.noGrad {
		return Output{}, ErrNoGrad
	}
	if err := s.check(in, m); err != nil {
		return Output{}, err
	}
	if _, busy := s.saved[mb]; busy && m == modeTrain {
		return Output{}, fmt.Errorf("%w: %d", ErrMicrobatchBusy, mb)
	}
	n := in.Batch * in.Seq
	run := &microbatch{n: n, shape: s.attnShape(in.Batch, in.Seq, in.Seq, 0)}
	pos := in.Positions
	if len(pos) == 0 {
		pos = make([]int32, n)
		for i := range pos {
			pos[i] = int32(i % in.Seq)
		}
	}
	run.pos = s.be.Alloc(tensor.Int32, n)
	s.be.UploadInt32(run.pos, pos)

	h := s.stageInput(run, in)
	for _, b := range s.blocks {
		out, acts := s.blockForward(b, h, run.pos, run.shape, n, nil, 0)
		if m == modeTrain {
			run.acts = append(run.acts, acts)
		} else {
			acts.free(s.be)
		}
		h = out
	}
	out := Output{SubspaceResidual: -1}
	if s.span.Head {
		s.headForward(run, h, in, m, &out)
	} else {
		out.Hidden = make([]float32, n*s.cfg.Dim)
		s.be.Download(out.Hidden, h)
		s.be.Free(h)
		out.SubspaceResidual = s.residual(out.Hidden, in.Tokens)
	}
	if m == modeTrain {
		s.saved[mb] = run
	} else {
		run.free(s.be)
	}
	if err := s.be.Sync(); err != nil {
		if m == modeTrain {
			s.Drop(mb)
		}
		return Output{}, fmt.Errorf("model: forward on %s: %w", s.be.Name(), err)
	}
	return out, nil
}

// stageInput is the first block's input: the embedding of the tokens, or
// the hidden states received from the previous stage.
func (s *Stage) stageInput(run *microbatch, in Input) tensor.Buffer {
	d := s.cfg.Dim
	h := s.alloc(run.n * d)
	if !s.span.Embed {
		s.be.Upload(h, in.Hidden)
		return h
	}
	run.tokens = s.be.Alloc(tensor.Int32, run.n)
	s.be.UploadInt32(run.tokens, in.Tokens)
	if s.basis == nil {
		s.be.Gather(h, s.embed.Value, run.tokens, d)
		return h
	}
	// h = Z_emb[tok]·Uᵀ + E_fix[tok]; E_fix rows are generated on the host.
	efix := make([]float32, run.n*d)
	for i, t := range in.Tokens {
		s.basis.EFixRow(int(t), efix[i*d:(i+1)*d])
	}
	s.be.Upload(h, efix)
	k := s.cfg.Subspace.Rank
	z := s.alloc(run.n * k)
	s.be.Gather(z, s.embed.Value, run.tokens, k)
	s.be.Gemm(false, true, run.n, d, k, 1, z, s.u, 1, h)
	s.be.Free(z)
	return h
}

// headForward applies the final norm, the head and (with targets) the
// loss, whose gradient it computes at once into the logits' memory.
func (s *Stage) headForward(run *microbatch, h tensor.Buffer, in Input, m mode, out *Output) {
	c := s.cfg
	n, d, v := run.n, c.Dim, c.Vocab
	hn, rstd := s.alloc(n*d), s.alloc(n)
	s.be.RMSNorm(hn, rstd, h, s.finalNorm.Value, d, float32(c.NormEps))
	logits := s.alloc(n * v)
	s.be.Gemm(false, true, n, v, d, 1, hn, s.head.Value, 0, logits)
	s.be.Free(hn)
	if len(in.Targets) == 0 {
		out.Logits = make([]float32, n*v)
		s.be.Download(out.Logits, logits)
		for _, b := range []tensor.Buffer{logits, h, rstd} {
			s.be.Free(b)
		}
		return
	}
	for _, t := range in.Targets {
		if t >= 0 {
			out.Targets++
		}
	}
	denom := in.LossTokens
	if denom == 0 {
		denom = out.Targets
	}
	var scale float32
	if denom > 0 {
		scale = 1 / float32(denom)
	}
	tg := s.be.Alloc(tensor.Int32, n)
	s.be.UploadInt32(tg, in.Targets)
	out.LossSum = s.be.SoftmaxCrossEntropy(logits, logits, tg, v, scale)
	s.be.Free(tg)
	if denom > 0 {
		out.Loss = out.LossSum / float64(denom)
	}
	if m == modeTrain {
		run.hFinal, run.rstdFinal, run.dlogits = h, rstd, logits
		return
	}
	for _, b := range []tensor.Buffer{logits, h, rstd} {
		s.be.Free(b)
	}
}

// residual measures the subspace invariant of hidden states h.
func (s *Stage) residual(h []float32, tokens []int32) float64 {
	if s.basis == nil || len(tokens) == 0 {
		return -1
	}
	toks := make([]int, len(tokens))
	for i, t := range tokens {
		toks[i] = int(t)
	}
	c := make([]float32, len(toks)*s.basis.Rank())
	return s.basis.Encode(h, toks, c)
}

// Backward consumes microbatch mb's saved activations, adds its parameter
// gradients to the accumulated ones and returns the gradient of the loss
// with respect to the stage's input hidden states (N×d), or nil for the
// first stage. gradOut is the gradient with respect to this stage's output
// (N×d); the head stage takes none (nil): its gradient starts at the loss.
func (s *Stage) Backward(mb int, gradOut []float32) ([]float32, error) {
	run, ok := s.saved[mb]
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownMicrobatch, mb)
	}
	d := s.cfg.Dim
	var dh tensor.Buffer
	if s.span.Head {
		if len(gradOut) != 0 {
			return nil, fmt.Errorf("%w: the head stage takes no output gradient", ErrInput)
		}
	} else {
		if len(gradOut) != run.n*d {
			return nil, fmt.Errorf("%w: output gradient has %d values, want %d×%d", ErrInput, len(gradOut), run.n, d)
		}
		for i, v := range gradOut {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: output gradient %d is not finite", ErrInput, i)
			}
		}
	}
	delete(s.saved, mb)
	defer run.free(s.be)
	if s.span.Head {
		dh = s.headBackward(run)
	} else {
		dh = s.alloc(run.n * d)
		s.be.Upload(dh, gradOut)
	}
	for i := len(s.blocks) - 1; i >= 0; i-- {
		s.blockBackward(s.blocks[i], run.acts[i], dh, run.pos, run.shape, run.n)
	}
	var gradIn []float32
	if s.span.Embed {
		s.embedBackward(run, dh)
	} else {
		gradIn = make([]float32, run.n*d)
		s.be.Download(gradIn, dh)
	}
	s.be.Free(dh)
	if err := s.be.Sync(); err != nil {
		return nil, fmt.Errorf("model: backward on %s: %w", s.be.Name(), err)
	}
	return gradIn, nil
}

// headBackward returns ∂L/∂h at the head's input.
func (s *Stage) headBackward(run *microbatch) tensor.Buffer {
	c := s.cfg
	n, d, v := run.n, c.Dim, c.Vocab
	hn := s.alloc(n * d)
	s.be.RMSNorm(hn, run.rstdFinal, run.hFinal, s.finalNorm.Value, d, float32(c.NormEps))
	s.be.Gemm(true, false, v, d, n, 1, run.dlogits, hn, 1, s.head.Grad)
	dhn := hn // hn is no longer needed once the head's gradient has it
	s.be.Gemm(false, false, n, d, v, 1, run.dlogits, s.head.Value, 0, dhn)
	dh := s.alloc(n * d)
	s.be.RMSNormBackward(dh, s.finalNorm.Grad, dhn, run.hFinal, s.finalNorm.Value, run.rstdFinal, d)
	s.be.Free(dhn)
	return dh
}

// embedBackward adds the embedding's gradient; with the subspace
// constraint it lives in k-space: dZ_emb[tok] += dh·U.
func (s *Stage) embedBackward(run *microbatch, dh tensor.Buffer) {
	d := s.cfg.Dim
	if s.basis == nil {
		s.be.ScatterAdd(s.embed.Grad, run.tokens, dh, d)
		return
	}
	k := s.cfg.Subspace.Rank
	dz := s.alloc(run.n * k)
	s.be.Gemm(false, false, run.n, k, d, 1, dh, s.u, 0, dz)
	s.be.ScatterAdd(s.embed.Grad, run.tokens, dz, k)
	s.be.Free(dz)
}
