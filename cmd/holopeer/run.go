package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/node"
	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

func init() { register(newRunCmd) }

type runFlags struct {
	up     upFlags
	out    string
	steps  int
	asJSON bool
	wait   time.Duration
}

func newRunCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run job.yaml",
		Short: "Train a model across the swarm from a job manifest",
		Long: `run joins the swarm as a peer (the researcher's node), submits the job to the
elected coordinator, and trains: this node keeps the embedding (first stage)
and the final norm, head and loss (last stage), so tokens and labels never
leave it; the coordinator places the blocks on the machines on offer, and the
stages stream activations to each other directly. It shows progress, writes a
loss log and checkpoints, survives stage nodes leaving, and exits with the
final checkpoint written.

Outputs go to --out (default: the manifest's checkpoint.dir):
  loss.jsonl      one line per step
  steps.jsonl     applied steps and rollbacks (the exactly-once log)
  checkpoints/    every stage's shard at each checkpoint interval
  final/          the trained model in the Hugging Face layout`,
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
			if f.steps > 0 {
				m.Train.Steps = f.steps
				m.Train.Optimizer.WarmupSteps = min(m.Train.Optimizer.WarmupSteps, f.steps)
			}
			n, err := node.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer n.Close()
			out := f.out
			if out == "" {
				out = m.Resolve(m.Checkpoint.Dir)
			}
			sum, err := runJob(cmd.Context(), n, m, runOptions{Out: out, Stdout: cmd.OutOrStdout(), Quiet: f.asJSON, Wait: f.wait})
			if err != nil {
				return err
			}
			if f.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(sum)
			}
			return nil
		},
	}
	f.up.registerResearcher(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "directory for the loss log, checkpoints and the final model (default: the manifest's checkpoint.dir)")
	fl.IntVar(&f.steps, "steps", 0, "override train.steps")
	fl.BoolVar(&f.asJSON, "json", false, "print only a JSON summary at the end")
	fl.DurationVar(&f.wait, "timeout", defaultCoordinatorWait, "how long to wait for the swarm's coordinator before giving up (a cause found sooner, such as a wrong --swarm, ends the wait at once)")
	return cmd
}

// runOptions are what runJob needs besides the node and the manifest.
type runOptions struct {
	Out    string
	Stdout io.Writer
	Quiet  bool
	// Wait bounds the wait for a coordinator (0: two minutes).
	Wait time.Duration
	// OnStep is called after each committed step (testnet kills a stage
	// node from here).
	OnStep func(p pipeline.Progress)
}

// runSummary ends a swarm run; `holopeer testnet --json` prints it.
type runSummary struct {
	JobID       string  `json:"job_id"`
	Steps       int     `json:"steps"`
	InitialLoss float64 `json:"initial_loss"`
	FinalLoss   float64 `json:"final_loss"`
	TokensPerS  float64 `json:"tokens_per_s"`
	// BytesPerToken is the activation and gradient payload one token costs
	// at one stage boundary (forward plus backward); DenseBytes is what
	// bf16 activations would cost.
	BytesPerToken float64    `json:"bytes_per_token"`
	DenseBytes    float64    `json:"dense_bytes_per_token"`
	WireBytes     int64      `json:"wire_bytes"` // everything on the researcher's links
	Codec         string     `json:"codec"`
	Coordinator   runCoord   `json:"coordinator"`
	Stages        []runStage `json:"stages"`
	Recoveries    int        `json:"recoveries"`
	Elapsed       float64    `json:"elapsed_s"`
	Checkpoint    string     `json:"checkpoint"`
	LossLog       string     `json:"loss_log"`
	StepLog       string     `json:"step_log"`
	Bound         float64    `json:"window_bound,omitempty"`
	records       []stepRecord
}

type runCoord struct {
	PeerID   string `json:"peer_id"`
	Term     uint64 `json:"term"`
	TEE      string `json:"tee"`
	Insecure bool   `json:"insecure"`
}

type runStage struct {
	Index    int      `json:"index"`
	Blocks   string   `json:"blocks"`
	Replicas []string `json:"replicas"`
}

// runJob trains m across the swarm from node n.
func runJob(ctx context.Context, n *node.Node, m *manifest.Manifest, o runOptions) (runSummary, error) {
	var sum runSummary
	say := func(format string, a ...any) {
		if !o.Quiet {
			fmt.Fprintf(o.Stdout, format+"\n", a...)
		}
	}
	tok, err := tokenizer.New(m.Tokenizer, m.Resolve(m.Model.Checkpoint))
	if err != nil {
		return sum, fmt.Errorf("tokenizer: %w", err)
	}
	spec, err := pipeline.SpecFor(m, tok)
	if err != nil {
		return sum, err
	}
	newSource, err := pipeline.SourceFor(m, tok)
	if err != nil {
		return sum, err
	}
	if err := os.MkdirAll(o.Out, 0o700); err != nil {
		return sum, err
	}
	say("job %s: %s, %d blocks of d=%d (%s parameters) on %d stages × %d replicas, codec %s",
		spec.JobID, m.Name, spec.Model.Layers, spec.Model.Dim, si(float64(spec.Model.ParamCount())), spec.Stages, spec.Replicas, spec.Codec)

	var progress io.Writer = Stderr
	if o.Quiet {
		progress = nil
	}
	c, err := awaitCoordinator(ctx, n, o.Wait, progress)
	if err != nil {
		return sum, err
	}
	if spec.RequireAttested && c.TEE == "" {
		return sum, errors.New("the manifest requires an attested coordinator and the coordinator offers no evidence")
	}
	label := c.TEE
	if c.Insecure {
		label += " — INSECURE: sim attestation, testnets only"
	}
	say("coordinator %s, term %d, attested by %s", c.PeerID, c.Term, label)
	sum.Coordinator = runCoord{PeerID: c.PeerID.String(), Term: c.Term, TEE: c.TEE, Insecure: c.Insecure}

	var perm *pipeline.Permutation
	var secret []byte
	if spec.Model.Subspace.Enabled() {
		// Subspace stages see token ids: give them pseudonyms under a
		// secret that stays here.
		// A fresh key for every job: two jobs never share a substitution.
		// It stays in the output directory, beside final/ but not in it,
		// where serving the factors through the swarm again finds it.
		secret = pipeline.NewSecret()
		if err := os.WriteFile(filepath.Join(o.Out, "pseudonyms.secret"), secret, 0o600); err != nil {
			return sum, err
		}
		if perm, err = pipeline.NewPermutation(spec.Model.Vocab, secret); err != nil {
			return sum, err
		}
	}
	lossLog, err := os.Create(filepath.Join(o.Out, "loss.jsonl"))
	if err != nil {
		return sum, err
	}
	defer lossLog.Close()
	sum.LossLog, sum.StepLog = lossLog.Name(), filepath.Join(o.Out, "steps.jsonl")
	os.Remove(sum.StepLog)
	if syn, ok := newSyntheticBound(m); ok {
		sum.Bound = syn
	}

	display := newTrainDisplay(o.Stdout, o.Quiet, spec.Steps, max(1, spec.Steps/20))
	// Progress runs on the driver's goroutine: no locking needed.
	var (
		lastPts []api.Point
		lastPub time.Time
	)
	store := &pipeline.DiskStore{Dir: filepath.Join(o.Out, "checkpoints")}
	var weights pipeline.WeightSource
	if spec.FromCheckpoint {
		w, err := openFineTune(m, spec)
		if err != nil {
			return sum, err
		}
		defer w.Close()
		weights = w
	}
	var drv *pipeline.Driver
	cfg := pipeline.DriverConfig{
		Weights: weights,
		Spec:    spec, NewSource: newSource, Pseudonyms: perm, Checkpoints: store, StepLog: sum.StepLog,
		Logger: n.Logger(),
		Progress: func(p pipeline.Progress) {
			rec := stepRecord{Step: p.Step, Loss: p.Loss, LR: p.LR, GradNorm: p.GradNorm, Tokens: p.Tokens, Elapsed: p.Elapsed.Seconds()}
			for len(sum.records) > 0 && sum.records[len(sum.records)-1].Step >= p.Step {
				sum.records = sum.records[:len(sum.records)-1] // a rollback re-runs steps
			}
			sum.records = append(sum.records, rec)
			b, _ := json.Marshal(rec)
			lossLog.Write(append(b, '\n'))
			display.update(rec)
			lastPts = append(lastPts, api.Point{X: float64(p.Step), Y: p.Loss})
			publish := time.Since(lastPub) > time.Second || p.Step == p.Steps
			pts := lastPts
			if publish {
				lastPts, lastPub = nil, time.Now()
			}
			if publish {
				n.ReportJob(ctx, jobStatus(spec, p, pts, n.Host().ID().String()))
			}
			sum.Recoveries = p.Recoveries
			sum.BytesPerToken = p.BoundaryBytesPerToken
			sum.TokensPerS = p.TokensPerS
			sum.WireBytes = p.BytesSent
			if o.OnStep != nil {
				o.OnStep(p)
			}
		},
	}
	// A coordinator elected mid-run takes the job over from our plan.
	current := func(id string) []byte {
		if drv == nil {
			return nil
		}
		return drv.SignedPlan(id)
	}
	drv, err = n.Runtime().NewDriver(cfg, n.CoordinatorClient(current))
	if err != nil {
		return sum, err
	}
	start := time.Now()
	if err := drv.Run(ctx); err != nil {
		display.finish()
		n.ReportJob(context.Background(), api.JobStatus{JobID: spec.JobID, Name: spec.Name, Kind: "train", State: "failed", Researcher: n.Host().ID().String(), Error: err.Error()})
		return sum, err
	}
	display.finish()
	sum.Elapsed = time.Since(start).Seconds()
	p := drv.Plan()
	sum.JobID, sum.Steps, sum.Codec = spec.JobID, spec.Steps, spec.Codec
	for _, s := range p.Stages {
		sum.Stages = append(sum.Stages, runStage{Index: s.Index, Blocks: fmt.Sprintf("%d-%d", s.First, s.Last-1), Replicas: s.Replicas})
	}
	if len(sum.records) > 0 {
		sum.InitialLoss = sum.records[0].Loss
		k := max(1, len(sum.records)/10)
		var s float64
		for _, r := range sum.records[len(sum.records)-k:] {
			s += r.Loss
		}
		sum.FinalLoss = s / float64(k)
	}
	sum.DenseBytes = float64(2 * 2 * spec.Model.Dim) // bf16 activations forward and gradients backward
	final := filepath.Join(o.Out, "final")
	if err := writeFinal(final, store, p, tok, perm); err != nil {
		return sum, fmt.Errorf("final checkpoint: %w", err)
	}
	sum.Checkpoint = final
	if !o.Quiet {
		fmt.Fprintln(o.Stdout)
		printLossCurve(o.Stdout, sum.records, sum.Bound)
		fmt.Fprintln(o.Stdout)
		say("%d steps in %s, %s tokens/s; loss %.4f → %.4f", sum.Steps, time.Duration(sum.Elapsed*float64(time.Second)).Round(time.Second), si(sum.TokensPerS), sum.InitialLoss, sum.FinalLoss)
		if sum.Bound > 0 {
			say("best possible on %d-token windows of this corpus: %.4f", spec.SeqLen, sum.Bound)
		}
		say("on the wire: %.1f bytes per token per stage boundary, forward and backward (bf16 activations: %.0f; %.1f%% saved) over %d boundaries",
			sum.BytesPerToken, sum.DenseBytes, 100*(1-sum.BytesPerToken/sum.DenseBytes), spec.Stages+1)
		for _, s := range sum.Stages {
			say("stage %d: blocks %s on %s", s.Index, s.Blocks, shortIDs(s.Replicas))
		}
		if sum.Recoveries > 0 {
			say("recovered from %d lost stage node(s); step log: %s", sum.Recoveries, sum.StepLog)
		}
		say("final model: %s", final)
	}
	done := api.JobStatus{JobID: spec.JobID, Name: spec.Name, Kind: "train", State: "done",
		Researcher: n.Host().ID().String(), Codec: spec.Codec, Step: spec.Steps, Steps: spec.Steps, TokensPerS: sum.TokensPerS,
		BytesPerToken: sum.BytesPerToken, Recoveries: sum.Recoveries, BytesSent: map[string]int64{spec.Codec: sum.WireBytes}}
	for _, s := range p.Stages {
		done.Stages = append(done.Stages, api.JobStage{Index: s.Index, First: s.First, Last: s.Last, Replicas: s.Replicas})
	}
	n.ReportJob(context.Background(), done)
	return sum, nil
}

func jobStatus(spec job.Spec, p pipeline.Progress, pts []api.Point, researcher string) api.JobStatus {
	st := api.JobStatus{
		JobID: spec.JobID, Name: spec.Name, Kind: string(spec.Kind), State: "running", Researcher: researcher,
		Codec: spec.Codec, Step: p.Step, Steps: p.Steps, Loss: pts, TokensPerS: p.TokensPerS,
		BytesSent: map[string]int64{spec.Codec: p.BytesSent}, Recoveries: p.Recoveries,
	}
	if p.Tokens > 0 {
		st.BytesPerToken = float64(p.BytesSent) / float64(p.Tokens)
	}
	if p.Plan != nil {
		for _, s := range p.Plan.Stages {
			st.Stages = append(st.Stages, api.JobStage{Index: s.Index, First: s.First, Last: s.Last, Replicas: s.Replicas})
		}
	}
	return st
}

// openFineTune opens the checkpoint a swarm job starts from and checks,
// from its headers, that it holds every tensor of the job's model.
func openFineTune(m *manifest.Manifest, spec job.Spec) (*checkpoint.Checkpoint, error) {
	if spec.Model.Subspace.Enabled() {
		// The pseudonymised ids of a subspace job index embedding rows the
		// checkpoint keeps in real order; moving them is not built yet.
		return nil, errors.New("fine-tuning a checkpoint across the swarm with the subspace codec is not supported yet: use another pipeline.codec, or train --local")
	}
	ck, err := checkpoint.Open(m.Resolve(m.Model.Checkpoint))
	if err != nil {
		return nil, err
	}
	if err := ck.Check(spec.Model, model.Span{First: 0, Last: spec.Model.Layers, Embed: true, Head: true}); err != nil {
		ck.Close()
		return nil, fmt.Errorf("model.checkpoint does not fit the job: %w", err)
	}
	return ck, nil
}

// writeFinal writes the last checkpoint's shards as one Hugging Face
// checkpoint directory (sharded with an index above 2 GiB). A subspace job
// trained in pseudonym space: its embedding and head rows are put back in
// real token order in the dense export; the factors keep pseudonym order,
// and the secret stays outside the export, in the run's directory.
func writeFinal(dir string, store *pipeline.DiskStore, p *job.Plan, tok tokenizer.Tokenizer, perm *pipeline.Permutation) error {
	// Each tensor streams from its shard file into the export, so the
	// researcher never holds the model (nor its moments).
	e, err := pipeline.ExportSources(store, p, perm)
	if err != nil {
		return err
	}
	defer e.Close()
	return checkpoint.SaveSources(dir, p.Spec.Model, e.Dense, e.Factors, checkpoint.WithTokenizer(tok))
}

// newSyntheticBound is the best loss possible on the synthetic corpus for
// the job's window length (0, false for other data).
func newSyntheticBound(m *manifest.Manifest) (float64, bool) {
	s := m.Data.Synthetic
	if s == nil {
		return 0, false
	}
	cfg := data.DefaultSyntheticConfig()
	cfg.Seed = s.Seed
	if s.Temperature != 0 {
		cfg.Temperature = s.Temperature
	}
	syn, err := data.NewSynthetic(cfg)
	if err != nil {
		return 0, false
	}
	return syn.WindowBound(m.Train.SeqLen), true
}

func shortIDs(ids []string) string {
	var out []string
	for _, id := range ids {
		if len(id) > 16 {
			id = id[:8] + "…" + id[len(id)-6:]
		}
		out = append(out, id)
	}
	return strings.Join(out, ", ")
}
