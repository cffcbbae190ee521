package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/node"
	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

func init() { register(newServeCmd) }

type serveFlags struct {
	up         upFlags
	http       string
	apiKey     string
	corsOrigin []string
	allowHost  []string
	wait       time.Duration
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve job.yaml",
		Short: "Serve a checkpoint from the swarm behind an OpenAI-compatible HTTP API",
		Long: `serve joins the swarm as a peer (the researcher's node) and places the
manifest's model.checkpoint on the machines on offer like a training job: the
coordinator splits the blocks into pipeline.stages stages of
replicas_per_stage nodes each, every stage node fetches only its blocks'
weights from this node, and this node keeps the embedding and the head, so
prompts and generated text never leave it. Stages run forward only with a KV
cache per request; tokens cross the stages with pipeline.codec (int8 or bf16
for a dense checkpoint, subspace for one trained with the subspace
constraint).

It then answers on --http:
  POST /v1/completions         {"prompt": "...", "max_tokens": 64, ...}
  POST /v1/chat/completions    {"messages": [{"role": "user", "content": "..."}], ...}
  GET  /v1/models
with temperature, top_p, max_tokens, stop (string or list), seed and
"stream": true for server-sent events. Requests are batched across the
stages; the serve section of the manifest bounds prompt and output lengths,
the requests generating at once (max_batch) and those waiting (max_queue:
beyond it, 429). If a stage node leaves mid-generation, its requests
continue on a replica or a newly placed node, which rebuilds its KV cache by
replaying each request's prefix: clients see a pause, never a broken stream.

Chat uses a plain template, one "role: content" line per message and then
"assistant:"; generation stops where the model starts another turn.

Every documented OpenAI parameter is accepted by name. Penalties,
logit_bias, logprobs, n, best_of, echo and response_format text are
honoured; tools, JSON response formats and audio are refused with code
"unsupported".

The API answers only Host names on loopback, the --http host and
--allow-host names; POST bodies must be application/json; browser pages may
call it only from a --cors-origin; with --api-key (or $HOLOPEER_API_KEY)
every request but GET /health needs "Authorization: Bearer KEY".`,
		Example: `  holopeer serve testnet/serve.yaml --bootstrap /ip4/127.0.0.1/tcp/7600/p2p/12D3KooW…
  curl -N http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "the ", "max_tokens": 40, "temperature": 0, "stream": true}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.up.config()
			if err != nil {
				return err
			}
			m, err := manifest.Load(args[0])
			if err != nil {
				return err
			}
			limitMemory(cfg.Offer.MemoryBytes)
			n, err := node.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer n.Close()
			if f.apiKey == "" {
				// From the environment, so that the key stays out of ps and
				// shell history (and out of --help's defaults).
				f.apiKey = os.Getenv("HOLOPEER_API_KEY")
			}
			return serveOnNode(cmd.Context(), n, m, serveOptions{HTTP: f.http, Stdout: cmd.OutOrStdout(), Logger: cfg.Logger,
				APIKey: f.apiKey, CORSOrigins: f.corsOrigin, AllowedHosts: f.allowHost, Wait: f.wait})
		},
	}
	f.up.registerResearcher(cmd)
	cmd.Flags().DurationVar(&f.wait, "timeout", defaultCoordinatorWait, "how long to wait for the swarm's coordinator before giving up (a cause found sooner, such as a wrong --swarm, ends the wait at once)")
	cmd.Flags().StringVar(&f.http, "http", "127.0.0.1:8000", "HOST:PORT of the OpenAI-compatible API (loopback unless you mean otherwise)")
	cmd.Flags().StringVar(&f.apiKey, "api-key", "", "require this key as 'Authorization: Bearer KEY' on the API (default $HOLOPEER_API_KEY; none: no key)")
	cmd.Flags().StringSliceVar(&f.corsOrigin, "cors-origin", nil, "web origin (scheme://host[:port], or *) whose pages may call the API; repeat for more (default none)")
	cmd.Flags().StringSliceVar(&f.allowHost, "allow-host", nil, "a Host name the API answers besides loopback and the --http host (a proxy's or DNS name); repeat for more")
	return cmd
}

// serveOptions are what serving needs besides the node and the manifest.
type serveOptions struct {
	HTTP   string
	Stdout io.Writer
	Logger *slog.Logger
	// Wait bounds the wait for a coordinator (0: two minutes).
	Wait time.Duration
	// Ready, if set, is called with the API's base URL once it answers
	// (testnet prints a curl line; tests send requests).
	Ready func(baseURL string)
	// APIKey, CORSOrigins and AllowedHosts are serve.Config's.
	APIKey       string
	CORSOrigins  []string
	AllowedHosts []string
	// Metrics, if set, receives the API's per-job collectors.
	Metrics prometheus.Registerer
}

// serveOnNode places m's checkpoint on the swarm from node n and serves it
// on o.HTTP until ctx ends.
func serveOnNode(ctx context.Context, n *node.Node, m *manifest.Manifest, o serveOptions) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	sv, err := prepareServe(m)
	if err != nil {
		return err
	}
	defer sv.ck.Close()
	fmt.Fprintf(o.Stdout, "serving %s: %d blocks of d=%d (%s parameters) on %d stages × %d replicas, codec %s\n",
		sv.spec.Name, sv.spec.Model.Layers, sv.spec.Model.Dim, si(float64(sv.spec.Model.ParamCount())), sv.spec.Stages, sv.spec.Replicas, sv.spec.Codec)

	c, err := awaitCoordinator(ctx, n, o.Wait, Stderr)
	if err != nil {
		return err
	}
	if sv.spec.RequireAttested && c.TEE == "" {
		return errors.New("the manifest requires an attested coordinator and the coordinator offers no evidence")
	}
	var srv *pipeline.Server
	client := n.CoordinatorClient(func(id string) []byte {
		if srv == nil {
			return nil
		}
		return srv.SignedPlan(id)
	})
	srv, err = n.Runtime().NewServer(pipeline.ServeConfig{
		Spec: sv.spec, Weights: sv.weights, Pseudonyms: sv.perm, Logger: o.Logger,
	}, client)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := srv.Start(ctx); err != nil {
		return fmt.Errorf("place the model: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(cctx)
	}()
	for _, s := range srv.Stats().Plan.Stages {
		fmt.Fprintf(o.Stdout, "stage %d: blocks %d-%d on %s\n", s.Index, s.First, s.Last-1, strings.Join(s.Replicas, ", "))
	}
	fmt.Fprintf(o.Stdout, "every stage loaded its blocks in %v\n", time.Since(start).Round(time.Millisecond))
	rctx, stopReports := context.WithCancel(ctx)
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		reportServing(rctx, n, srv, 2*time.Second)
	}()
	if m := n.Metrics(); m != nil && o.Metrics == nil {
		o.Metrics = m.Registry()
	}
	err = serveHTTP(ctx, srv, sv, o)
	stopReports()
	<-reported
	return err
}

// reportServing publishes the serving job's state to the swarm (status,
// dashboard) every interval until ctx ends, then once more as done.
func reportServing(ctx context.Context, n *node.Node, srv *pipeline.Server, every time.Duration) {
	spec := srv.Spec()
	self := n.Host().ID().String()
	status := func(state string, tps float64) api.JobStatus {
		st := srv.Stats()
		js := api.JobStatus{JobID: spec.JobID, Name: spec.Name, Kind: string(job.KindServe), State: state, Researcher: self,
			Codec: spec.Codec, TokensPerS: tps, Recoveries: st.Recoveries}
		if st.Plan != nil {
			for _, s := range st.Plan.Stages {
				js.Stages = append(js.Stages, api.JobStage{Index: s.Index, First: s.First, Last: s.Last, Replicas: s.Replicas})
			}
		}
		return js
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last, at := srv.Stats().Tokens, time.Now()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			n.ReportJob(dctx, status("done", 0))
			cancel()
			return
		case now := <-t.C:
			tokens := srv.Stats().Tokens
			n.ReportJob(ctx, status("running", float64(tokens-last)/now.Sub(at).Seconds()))
			last, at = tokens, now
		}
	}
}

// serveTrained serves the checkpoint a training run of m wrote (what
// `holopeer testnet --serve` does after training): the same pipeline
// shape, codec and privacy terms, prompts and outputs of up to half the
// model's context each. It blocks until ctx ends.
func serveTrained(ctx context.Context, n *node.Node, m *manifest.Manifest, checkpointDir string, o serveOptions) error {
	hf, err := checkpoint.ReadConfig(checkpointDir)
	if err != nil {
		return err
	}
	cfg, err := hf.Model()
	if err != nil {
		return err
	}
	sm := *m
	sm.Name = m.Name
	sm.Model = manifest.Model{Checkpoint: checkpointDir}
	sm.Serve = &manifest.Serve{MaxPromptTokens: max(1, cfg.MaxSeq/2), MaxOutputTokens: max(1, cfg.MaxSeq-cfg.MaxSeq/2)}
	sm.ApplyDefaults()
	if err := sm.Validate(); err != nil {
		return fmt.Errorf("serving %s: %w", checkpointDir, err)
	}
	return serveOnNode(ctx, n, &sm, o)
}

// serveHTTP runs the API in front of an engine until ctx ends.
func serveHTTP(ctx context.Context, eng serve.Engine, sv *servePlan, o serveOptions) error {
	api, err := serve.New(serve.Config{
		Model: sv.spec.Name, Engine: eng, Tokenizer: sv.tok, Vocab: sv.spec.Model.Vocab, EOS: sv.eos,
		ContextTokens: sv.spec.MaxTokens, MaxPromptTokens: sv.maxPrompt, MaxOutputTokens: sv.maxOutput,
		MaxBatch: sv.spec.MaxBatch, MaxQueue: sv.maxQueue, Logger: o.Logger,
		APIKey: o.APIKey, CORSOrigins: o.CORSOrigins, Metrics: o.Metrics, Job: sv.spec.JobID,
		// The host it listens on (0.0.0.0: any IP literal) and the names asked for.
		AllowedHosts: append([]string{listenHost(o.HTTP)}, o.AllowedHosts...),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.HTTP)
	if err != nil {
		return fmt.Errorf("--http %s: %w", o.HTTP, err)
	}
	served := make(chan error, 1)
	go func() { served <- api.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(o.Stdout, "OpenAI-compatible API on %s/v1 (model %q); try:\n", base, sv.spec.Name)
	fmt.Fprintf(o.Stdout, "  curl -N %s/v1/completions -H 'Content-Type: application/json' -d '{\"prompt\": \"the \", \"max_tokens\": 40, \"temperature\": 0, \"stream\": true}'\n", base)
	if o.Ready != nil {
		o.Ready(base)
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return api.Shutdown(sctx)
}

// listenHost is the host part of a HOST:PORT listen address.
func listenHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// servePlan is a serving manifest resolved against its checkpoint.
type servePlan struct {
	spec      job.Spec
	ck        *checkpoint.Checkpoint
	weights   pipeline.WeightSource
	perm      *pipeline.Permutation
	tok       tokenizer.Tokenizer
	eos       []int
	maxPrompt int
	maxOutput int
	maxQueue  int
}

// prepareServe opens m's checkpoint and builds the serving job: the dense
// model for the int8, bf16 and fp32 codecs, the constrained one (its
// subspace factors) for the subspace codec.
func prepareServe(m *manifest.Manifest) (*servePlan, error) {
	if m.Model.Checkpoint == "" {
		return nil, errors.New("a serving manifest names the model to serve in model.checkpoint")
	}
	if m.Serve == nil {
		m.Serve = &manifest.Serve{}
		m.ApplyDefaults()
	}
	dir := m.Resolve(m.Model.Checkpoint)
	ck, err := checkpoint.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("model.checkpoint: %w", err)
	}
	sv := &servePlan{ck: ck, weights: ck}
	fail := func(err error) (*servePlan, error) {
		ck.Close()
		return nil, err
	}
	cfg := ck.Config()
	if m.Pipeline.Codec == "subspace" {
		trained := ck.TrainingConfig()
		if !trained.Subspace.Enabled() {
			return fail(fmt.Errorf("model.checkpoint %s holds a dense model (no subspace factors): serve it with pipeline.codec int8 or bf16", dir))
		}
		if trained.Subspace.Rank != m.Pipeline.Rank || trained.Subspace.Seed != m.Pipeline.SubspaceSeed {
			return fail(fmt.Errorf("model.checkpoint %s was trained with subspace rank %d, seed %d; set pipeline.rank and pipeline.subspace_seed to match",
				dir, trained.Subspace.Rank, trained.Subspace.Seed))
		}
		cfg = trained
		// A swarm-trained checkpoint keeps its factors in the pseudonym
		// order of the run's secret (holopeer run writes it beside final/);
		// the dense head was put back in real order, so reorder it too.
		if secret, ok := findSecret(dir); ok {
			if sv.perm, err = pipeline.NewPermutation(cfg.Vocab, secret); err != nil {
				return fail(err)
			}
			sv.weights = pseudonymHead{WeightSource: ck, perm: sv.perm, vocab: cfg.Vocab}
		}
	}
	tokSpec := m.Tokenizer
	if tokSpec == "" {
		tokSpec = ck.Tokenizer()
	}
	if sv.tok, err = tokenizer.New(tokSpec, dir); err != nil {
		return fail(fmt.Errorf("tokenizer: %w", err))
	}
	if sv.tok.VocabSize() > cfg.Vocab {
		return fail(fmt.Errorf("tokenizer %s has %d ids, more than the model's vocabulary %d", sv.tok.Name(), sv.tok.VocabSize(), cfg.Vocab))
	}
	sv.eos = ck.HF.EOS()
	s := m.Serve
	var maxTokens int
	maxTokens, sv.maxPrompt, sv.maxOutput = serveLimits(cfg.MaxSeq, s)
	sv.maxQueue = s.MaxQueue
	sv.spec = job.Spec{
		JobID: job.NewJobID(m.Name), Name: m.Name, Kind: job.KindServe,
		Model: cfg, FromCheckpoint: true, Codec: m.Pipeline.Codec,
		Stages: m.Pipeline.Stages, Replicas: m.Pipeline.ReplicasPerStage,
		MaxBatch: s.MaxBatch, MaxTokens: maxTokens,
		RefuseRelayed: m.Privacy.RefuseRelayedLinks, RequireAttested: m.Privacy.RequireAttested(),
	}
	if ck.WeightDType(cfg, model.Whole(cfg)) == tensor.BFloat16 {
		sv.spec.WeightDType = job.WeightBF16 // stages hold it at 2 bytes per parameter
	}
	if err := sv.spec.Validate(); err != nil {
		return fail(fmt.Errorf("manifest %s: %w", m.Name, err))
	}
	return sv, nil
}

// serveLimits are a serving manifest's per-request token limits on a
// model of context maxSeq: prompt plus output, and each part.
func serveLimits(maxSeq int, s *manifest.Serve) (context, prompt, output int) {
	context = min(maxSeq, s.MaxPromptTokens+s.MaxOutputTokens)
	return context, min(s.MaxPromptTokens, context-1), min(s.MaxOutputTokens, context-1)
}

// findSecret looks for the pseudonym secret of the run that wrote the
// checkpoint in dir: beside it, or in its parent (holopeer run's --out).
func findSecret(dir string) ([]byte, bool) {
	for _, p := range []string{filepath.Join(dir, "pseudonyms.secret"), filepath.Join(filepath.Dir(dir), "pseudonyms.secret")} {
		if b, err := os.ReadFile(p); err == nil && len(b) >= 16 {
			return b, true
		}
	}
	return nil, false
}

// pseudonymHead reads a checkpoint whose head rows are in real token
// order for a model that otherwise lives in pseudonym order (the factors
// of a swarm-trained subspace model): it moves row t of the head to row
// pseudonym(t) as it loads the head stage. Blocks stream through
// unchanged.
type pseudonymHead struct {
	pipeline.WeightSource
	perm  *pipeline.Permutation
	vocab int
}

func (p pseudonymHead) LoadStage(cfg model.Config, span model.Span, opts ...model.Option) (*model.Stage, error) {
	st, err := p.WeightSource.LoadStage(cfg, span, opts...)
	if err != nil || !span.Head || span.Embed {
		return st, err
	}
	ids := make([]int32, p.vocab)
	for i := range ids {
		ids[i] = int32(i)
	}
	ps := p.perm.Apply(ids)
	for _, prm := range st.Params() {
		if len(prm.Shape) != 2 || prm.Shape[0] != p.vocab {
			continue
		}
		cols := prm.Shape[1]
		real := prm.Data()
		moved := make([]float32, len(real))
		for t := range p.vocab {
			copy(moved[int(ps[t])*cols:(int(ps[t])+1)*cols], real[t*cols:(t+1)*cols])
		}
		if err := prm.Set(moved); err != nil {
			st.Close()
			return nil, err
		}
	}
	return st, nil
}
