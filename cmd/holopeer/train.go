package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

func init() { register(newTrainCmd) }

// Files of a training run's output directory.
const (
	runLossLog       = "loss.jsonl"
	runCheckpointDir = "checkpoint"
)

type trainFlags struct {
	local       bool
	steps       int
	out         string
	asJSON      bool
	evalEvery   int
	evalBatches int
	logEvery    int
	device      string
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train --local job.yaml",
		Short: "Train a job's model in this one process: the reference every swarm run is compared with",
		Long: `train --local runs the job of a manifest in this process, without a swarm:
the same model (pipeline.codec subspace trains the same constrained model the
swarm would; the other pipeline settings do not apply), the same data, batch
and microbatches, optimizer and schedule. It is the baseline a pipeline run
must match.

It shows a progress bar (step, loss, tokens/s, learning rate) on a terminal
and a plain line every --log-every steps otherwise, evaluates on held-out
windows every --eval-every steps, and writes to the output directory
(--out, else the manifest's checkpoint.dir, relative to the current
directory):
  loss.jsonl    one JSON object per step: step, loss, lr, grad_norm, tokens,
                elapsed (seconds), and eval_loss where it evaluated
  checkpoint/   the model in the Hugging Face layout (config.json,
                model.safetensors) plus optimizer and run state, every
                checkpoint.interval steps and at the end; load it with
                'holopeer generate --checkpoint DIR/checkpoint'
At the end it prints the loss curve and, for the synthetic corpus, the best
loss possible on its windows and how far the model is from it.

With --json, stdout carries one JSON object per line instead: a "step" event
per step and a final "done" event with the summary. Ctrl-C stops after the
current step and still writes a checkpoint.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !f.local {
				return errors.New("train runs only --local (this process); submit a job to the swarm with 'holopeer run job.yaml'")
			}
			return runTrainLocal(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.local, "local", false, "train in this process (required)")
	fl.IntVar(&f.steps, "steps", 0, "override train.steps (the schedule's length; warmup is capped at it)")
	fl.StringVar(&f.out, "out", "", "output directory (default: the manifest's checkpoint.dir)")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON lines instead of the progress display")
	fl.IntVar(&f.evalEvery, "eval-every", 0, "evaluate every N steps (default: steps/10) and at the end")
	fl.IntVar(&f.evalBatches, "eval-batches", 4, "held-out global batches per evaluation")
	fl.IntVar(&f.logEvery, "log-every", 0, "print a plain progress line every N steps when not on a terminal (default: steps/20)")
	fl.StringVar(&f.device, "device", "auto", "tensor backend: auto or one of "+strings.Join(tensor.Backends(), ", "))
	return cmd
}

// stepRecord is one line of loss.jsonl (and of --json output).
type stepRecord struct {
	Event    string   `json:"event,omitempty"`
	Step     int      `json:"step"` // steps completed
	Loss     float64  `json:"loss"`
	LR       float64  `json:"lr"`
	GradNorm float64  `json:"grad_norm"`
	Tokens   int64    `json:"tokens"`  // training tokens consumed so far
	Elapsed  float64  `json:"elapsed"` // seconds since training started
	EvalLoss *float64 `json:"eval_loss,omitempty"`
}

// trainSummary ends a run.
type trainSummary struct {
	Event       string  `json:"event"`
	Steps       int     `json:"steps"`
	SeqLen      int     `json:"seq_len"`
	Tokens      int64   `json:"tokens"`
	Elapsed     float64 `json:"elapsed"`
	TokensPerS  float64 `json:"tokens_per_s"`
	Params      int64   `json:"params"`
	Constrained bool    `json:"subspace"`
	FinalLoss   float64 `json:"final_loss"` // mean training loss of the last steps
	EvalLoss    float64 `json:"eval_loss"`
	// Synthetic corpus only: the entropy rate, the best mean loss on a
	// window of seq_len tokens, the Bayes-optimal loss of the exact
	// held-out windows, and the eval loss's gap above the window bound.
	EntropyRate float64 `json:"entropy_rate,omitempty"`
	WindowBound float64 `json:"window_bound,omitempty"`
	EvalOptimal float64 `json:"eval_optimal,omitempty"`
	GapPercent  float64 `json:"gap_percent,omitempty"`
	// ExcessPercent compares with the optimum of the same windows, which
	// removes their sampling noise: (eval − eval_optimal)/eval_optimal.
	ExcessPercent float64 `json:"excess_percent,omitempty"`
	Checkpoint    string  `json:"checkpoint"`
	LossLog       string  `json:"loss_log"`
	Interrupted   bool    `json:"interrupted,omitempty"`
}

// localJob is everything a local run is built from.
type localJob struct {
	m      *manifest.Manifest
	tok    tokenizer.Tokenizer
	cfg    model.Config
	tc     train.Config
	src    data.Source
	synth  *data.Synthetic  // the synthetic corpus, or nil
	text   *data.TextSource // the training part of a text corpus, or nil
	eval   [][]model.Input  // held-out global batches, as microbatches
	evalOp float64          // synthetic: Bayes-optimal loss of eval
	drawn  int64            // synthetic windows drawn from the stream
	rows   int              // sequences per step
	mbRows int              // sequences per microbatch
	seq    int              // tokens per sequence
	ck     *checkpoint.Checkpoint
}

func loadLocalJob(path string, f trainFlags) (*localJob, error) {
	m, err := manifest.Load(path)
	if err != nil {
		return nil, err
	}
	if f.steps < 0 {
		return nil, fmt.Errorf("--steps %d: use a positive number", f.steps)
	}
	if f.steps > 0 {
		m.Train.Steps = f.steps
		m.Train.Optimizer.WarmupSteps = min(m.Train.Optimizer.WarmupSteps, f.steps)
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("manifest %s with --steps %d: %w", path, f.steps, err)
		}
	}
	if f.evalBatches < 1 || f.evalBatches > 1024 {
		return nil, fmt.Errorf("--eval-batches %d: use 1 to 1024", f.evalBatches)
	}
	j := &localJob{m: m}
	ckDir := ""
	if m.Model.Checkpoint != "" {
		ckDir = m.Resolve(m.Model.Checkpoint)
	}
	if j.tok, err = tokenizer.New(m.Tokenizer, ckDir); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if j.cfg, err = checkpoint.ResolveModel(m, j.tok); err != nil {
		return nil, err
	}
	if j.tc, err = checkpoint.TrainConfig(m); err != nil {
		return nil, err
	}
	if ckDir != "" {
		if j.ck, err = checkpoint.Open(ckDir); err != nil {
			return nil, fmt.Errorf("model.checkpoint: %w", err)
		}
	}
	t := m.Train
	j.seq = t.SeqLen
	j.rows = t.BatchTokens / t.SeqLen
	j.mbRows = j.rows / t.Microbatches
	if err := j.openData(f.evalBatches); err != nil {
		j.close()
		return nil, err
	}
	if v := j.src.VocabSize(); v > j.cfg.Vocab {
		j.close()
		return nil, fmt.Errorf("the data's ids go up to %d but the model's vocabulary is %d", v-1, j.cfg.Vocab)
	}
	return j, nil
}

func (j *localJob) close() {
	if j.ck != nil {
		j.ck.Close()
	}
}

// openData builds the training source and draws the fixed held-out set.
// The synthetic corpus trains on its stream from the start, exactly the
// batches a swarm run of the job sees, and evaluates on the windows that
// follow the whole run's, which it never trains on. A text corpus trains
// on its first 95% and evaluates on the rest.
func (j *localJob) openData(evalBatches int) error {
	d := j.m.Data
	var held data.Source
	if s := d.Synthetic; s != nil {
		cfg := data.SyntheticConfig{Seed: s.Seed, Temperature: s.Temperature}
		syn, err := data.NewSynthetic(cfg)
		if err != nil {
			return fmt.Errorf("data.synthetic: %w", err)
		}
		after, err := data.NewSynthetic(cfg)
		if err != nil {
			return fmt.Errorf("data.synthetic: %w", err)
		}
		for range j.m.Train.Steps { // skip the run's windows
			if _, _, err := after.Next(j.rows, j.seq); err != nil {
				return err
			}
		}
		j.synth, j.src, held = syn, syn, after
	} else {
		all, err := data.NewTextFile(j.m.Resolve(d.Text), j.tok, j.m.Train.Seed)
		if err != nil {
			return fmt.Errorf("data.text: %w", err)
		}
		trainPart, val, err := all.Split(0.05)
		if err != nil {
			return fmt.Errorf("data.text: holding out 5%% for evaluation: %w", err)
		}
		j.text, j.src, held = trainPart, trainPart, val
	}
	var optimal float64
	for range evalBatches {
		in, tg, err := held.Next(j.rows, j.seq)
		if err != nil {
			return fmt.Errorf("held-out data: %w", err)
		}
		if j.synth != nil {
			o, err := j.synth.OptimalLoss(in, tg, j.rows, j.seq)
			if err != nil {
				return err
			}
			optimal += o
		}
		j.eval = append(j.eval, j.microbatches(in, tg))
	}
	j.evalOp = optimal / float64(evalBatches)
	return nil
}

// microbatches cuts a global batch of rows sequences into the manifest's
// microbatches.
func (j *localJob) microbatches(in, tg []int32) []model.Input {
	n := j.mbRows * j.seq
	mbs := make([]model.Input, 0, j.m.Train.Microbatches)
	for i := 0; i < len(in); i += n {
		mbs = append(mbs, model.Input{Batch: j.mbRows, Seq: j.seq, Tokens: in[i : i+n], Targets: tg[i : i+n]})
	}
	return mbs
}

// nextBatch draws one step's batch.
func (j *localJob) nextBatch() ([]model.Input, error) {
	in, tg, err := j.src.Next(j.rows, j.seq)
	if err != nil {
		return nil, err
	}
	if j.synth != nil {
		j.drawn += int64(j.rows)
	}
	return j.microbatches(in, tg), nil
}

// dataState is the data position a checkpoint records.
func (j *localJob) dataState() json.RawMessage {
	var v any
	switch {
	case j.synth != nil:
		v = map[string]int64{"synthetic_windows": j.drawn}
	case j.text != nil:
		v = map[string]any{"text": j.text.State()}
	}
	b, _ := json.Marshal(v)
	return b
}

func (j *localJob) buildModel(device string) (*model.Stage, error) {
	be, err := tensor.Open(device)
	if err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	if j.ck != nil {
		return j.ck.LoadStage(j.cfg, model.Whole(j.cfg), model.WithBackend(be))
	}
	m, err := model.New(j.cfg, model.WithBackend(be), model.WithSeed(j.m.Train.Seed))
	if err != nil {
		return nil, err
	}
	return m.Stage, nil
}

func runTrainLocal(ctx context.Context, stdout, stderr io.Writer, path string, f trainFlags) (err error) {
	j, err := loadLocalJob(path, f)
	if err != nil {
		return err
	}
	defer j.close()
	steps := j.m.Train.Steps
	evalEvery := f.evalEvery
	if evalEvery <= 0 {
		evalEvery = max(1, steps/10)
	}
	logEvery := f.logEvery
	if logEvery <= 0 {
		logEvery = max(1, steps/20)
	}
	ckInterval := j.m.Checkpoint.Interval

	out := f.out
	if out == "" {
		out = j.m.Checkpoint.Dir // relative to the working directory, like any output path
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	ckDir := filepath.Join(out, runCheckpointDir)
	logPath := filepath.Join(out, runLossLog)
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	logEnc := json.NewEncoder(logFile)

	st, err := j.buildModel(f.device)
	if err != nil {
		return err
	}
	defer st.Close()
	tr, err := train.New([]*model.Stage{st}, j.tc)
	if err != nil {
		return err
	}

	stdoutEnc := json.NewEncoder(stdout)
	disp := newTrainDisplay(stdout, f.asJSON, steps, logEvery)
	if !f.asJSON {
		c := j.cfg
		codec := "dense"
		if c.Subspace.Enabled() {
			codec = fmt.Sprintf("subspace rank %d", c.Subspace.Rank)
		}
		fmt.Fprintf(stdout, "training %s: %.2fM parameters (d=%d, %d layers, %d heads/%d kv, ffn %d, vocab %d, %s) on %s\n",
			j.m.Name, float64(c.ParamCount())/1e6, c.Dim, c.Layers, c.Heads, c.KVHeads, c.FFNDim, c.Vocab, codec, st.Backend().Name())
		fmt.Fprintf(stdout, "%d steps of %d tokens (%d microbatches of %d×%d), lr %g→%g, warmup %d\n",
			steps, j.rows*j.seq, j.m.Train.Microbatches, j.mbRows, j.seq, j.tc.Schedule.Peak, j.tc.Schedule.Min, j.tc.Schedule.Warmup)
		if j.synth != nil {
			fmt.Fprintf(stdout, "synthetic corpus: entropy rate %.4f nats/token, best loss on %d-token windows %.4f\n",
				j.synth.EntropyRate(), j.seq, j.synth.WindowBound(j.seq))
		}
	}

	save := func(step int, loss float64) error {
		snap, err := checkpoint.Capture([]*model.Stage{st}, tr.Optimizers())
		if err != nil {
			return err
		}
		snap.State = &checkpoint.TrainState{Step: step, Tokens: int64(step * j.rows * j.seq), Data: j.dataState(), Loss: loss}
		return checkpoint.Save(ckDir, snap, checkpoint.WithTokenizer(j.tok))
	}
	evaluate := func() (float64, error) {
		var sum float64
		for _, b := range j.eval {
			l, err := tr.Eval(ctx, b)
			if err != nil {
				return 0, err
			}
			sum += l
		}
		return sum / float64(len(j.eval)), nil
	}

	var (
		records   []stepRecord
		tokens    int64
		lastEval  = math.NaN()
		start     = time.Now()
		interrupt bool
	)
	for step := 0; step < steps; step++ {
		batch, err := j.nextBatch()
		if err != nil {
			return fmt.Errorf("data: %w", err)
		}
		res, err := tr.Step(ctx, batch)
		if err != nil {
			if ctx.Err() != nil {
				interrupt = true
				break
			}
			return fmt.Errorf("step %d: %w", step+1, err)
		}
		tokens += int64(j.rows * j.seq)
		rec := stepRecord{Step: step + 1, Loss: res.Loss, LR: res.LR, GradNorm: res.GradNorm, Tokens: tokens, Elapsed: time.Since(start).Seconds()}
		if (step+1)%evalEvery == 0 || step+1 == steps {
			if lastEval, err = evaluate(); err != nil {
				if ctx.Err() != nil {
					interrupt = true
					break
				}
				return fmt.Errorf("evaluation at step %d: %w", step+1, err)
			}
			ev := lastEval
			rec.EvalLoss = &ev
		}
		records = append(records, rec)
		if err := logEnc.Encode(rec); err != nil {
			return fmt.Errorf("%s: %w", logPath, err)
		}
		if f.asJSON {
			rec.Event = "step"
			stdoutEnc.Encode(rec)
		} else {
			disp.update(rec)
		}
		if ckInterval > 0 && (step+1)%ckInterval == 0 && step+1 < steps {
			if err := save(step+1, res.Loss); err != nil {
				return err
			}
		}
	}
	elapsed := time.Since(start)
	disp.finish()

	done := len(records)
	sum := trainSummary{
		Event: "done", Steps: done, SeqLen: j.seq, Tokens: tokens, Elapsed: elapsed.Seconds(),
		Params: j.cfg.ParamCount(), Constrained: j.cfg.Subspace.Enabled(),
		Checkpoint: ckDir, LossLog: logPath, Interrupted: interrupt,
	}
	if elapsed > 0 {
		sum.TokensPerS = float64(tokens) / elapsed.Seconds()
	}
	if done > 0 {
		tail := records[done-max(1, done/20):]
		for _, r := range tail {
			sum.FinalLoss += r.Loss / float64(len(tail))
		}
		if err := save(done, records[done-1].Loss); err != nil {
			return err
		}
	}
	if interrupt && done > 0 {
		// The last evaluation may be stale; evaluate what was saved.
		if l, err := evaluateNoCtx(tr, j.eval); err == nil {
			lastEval = l
		}
	}
	sum.EvalLoss = lastEval
	if j.synth != nil {
		sum.EntropyRate = j.synth.EntropyRate()
		sum.WindowBound = j.synth.WindowBound(j.seq)
		sum.EvalOptimal = j.evalOp
		sum.GapPercent = 100 * (lastEval - sum.WindowBound) / sum.WindowBound
		sum.ExcessPercent = 100 * (lastEval - j.evalOp) / j.evalOp
	}
	if f.asJSON {
		if math.IsNaN(sum.EvalLoss) {
			sum.EvalLoss = 0
		}
		stdoutEnc.Encode(sum)
	} else {
		printTrainSummary(stdout, sum, records, j.synth != nil)
	}
	if interrupt {
		return fmt.Errorf("interrupted after step %d; checkpoint saved to %s", done, ckDir)
	}
	return nil
}

func evaluateNoCtx(tr *train.Trainer, eval [][]model.Input) (float64, error) {
	var sum float64
	for _, b := range eval {
		l, err := tr.Eval(context.Background(), b)
		if err != nil {
			return 0, err
		}
		sum += l
	}
	return sum / float64(len(eval)), nil
}

// trainDisplay shows progress: a bar on a terminal, a plain line every
// logEvery steps otherwise, nothing with --json.
type trainDisplay struct {
	w        io.Writer
	bar      *progressbar.ProgressBar
	quiet    bool
	steps    int
	logEvery int
	last     stepRecord
	lastTime float64
	lastTok  int64
	eval     *float64 // the last evaluation, shown until the next
}

func newTrainDisplay(w io.Writer, quiet bool, steps, logEvery int) *trainDisplay {
	d := &trainDisplay{w: w, quiet: quiet, steps: steps, logEvery: logEvery}
	if !quiet && isTerminal(w) {
		d.bar = progressbar.NewOptions(steps,
			progressbar.OptionSetWriter(w),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetDescription("step"),
			progressbar.OptionShowDescriptionAtLineEnd(),
		)
	}
	return d
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (d *trainDisplay) update(r stepRecord) {
	if d.quiet {
		return
	}
	// tokens/s over the recent stretch, not since the start, so the
	// figure follows the machine's current load.
	rate := 0.0
	if dt := r.Elapsed - d.lastTime; dt > 0 {
		rate = float64(r.Tokens-d.lastTok) / dt
	}
	if r.EvalLoss != nil {
		d.eval = r.EvalLoss
	}
	if d.bar != nil {
		desc := fmt.Sprintf("loss %.4f  %s tok/s  lr %.2e", r.Loss, si(rate), r.LR)
		if d.eval != nil {
			desc += fmt.Sprintf("  eval %.4f", *d.eval)
		}
		d.bar.Describe(desc)
		d.bar.Add(1)
		if r.Elapsed-d.lastTime > 2 {
			d.lastTime, d.lastTok = r.Elapsed, r.Tokens
		}
		return
	}
	if r.Step%d.logEvery == 0 || r.Step == d.steps {
		line := fmt.Sprintf("step %*d/%d  loss %.4f  lr %.2e  %s tok/s  %s tokens  %s",
			len(fmt.Sprint(d.steps)), r.Step, d.steps, r.Loss, r.LR, si(rate), si(float64(r.Tokens)), time.Duration(r.Elapsed*float64(time.Second)).Round(time.Second))
		if r.EvalLoss != nil {
			line += fmt.Sprintf("  eval %.4f", *r.EvalLoss)
		}
		fmt.Fprintln(d.w, line)
		d.lastTime, d.lastTok = r.Elapsed, r.Tokens
	}
}

func (d *trainDisplay) finish() {
	if d.bar != nil {
		d.bar.Finish()
		fmt.Fprintln(d.w)
	}
}

// si prints a count with a k/M suffix.
func si(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.1fk", x/1e3)
	}
	return fmt.Sprintf("%.0f", x)
}

func printTrainSummary(w io.Writer, s trainSummary, records []stepRecord, synthetic bool) {
	fmt.Fprintln(w)
	printLossCurve(w, records, s.WindowBound)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%d steps, %s tokens in %s (%s tokens/s)\n", s.Steps, si(float64(s.Tokens)),
		time.Duration(s.Elapsed*float64(time.Second)).Round(time.Second), si(s.TokensPerS))
	fmt.Fprintf(w, "final training loss %.4f (mean of the last steps), held-out loss %.4f\n", s.FinalLoss, s.EvalLoss)
	if synthetic {
		fmt.Fprintf(w, "best possible: %.4f on %d-token windows (entropy rate %.4f; %.4f on these exact held-out windows)\n",
			s.WindowBound, s.SeqLen, s.EntropyRate, s.EvalOptimal)
		fmt.Fprintf(w, "gap: held-out loss is %.1f%% above the bound (%.1f%% above the optimum of the same windows)\n", s.GapPercent, s.ExcessPercent)
	}
	fmt.Fprintf(w, "checkpoint: %s\nloss log:   %s\n", s.Checkpoint, s.LossLog)
}

// printLossCurve prints a table of the loss every tenth of the run and a
// small text plot of the whole curve, with the bound as a line of dashes
// when there is one (bound 0: none).
func printLossCurve(w io.Writer, records []stepRecord, bound float64) {
	n := len(records)
	if n == 0 {
		return
	}
	every := max(1, n/10)
	fmt.Fprintf(w, "%8s %10s %10s %10s %10s\n", "step", "tokens", "loss", "eval", "lr")
	from := 0
	for i := every - 1; i < n; i += every {
		printRow(w, records[from:i+1])
		from = i + 1
	}
	if from < n {
		printRow(w, records[from:])
	}

	const width, height = 64, 12
	cols := min(width, n)
	ys := make([]float64, cols)
	lo, hi := math.Inf(1), math.Inf(-1)
	for c := range cols {
		a, b := c*n/cols, (c+1)*n/cols
		var s float64
		for _, r := range records[a:b] {
			s += r.Loss
		}
		ys[c] = s / float64(b-a)
		lo, hi = math.Min(lo, ys[c]), math.Max(hi, ys[c])
	}
	if bound > 0 {
		lo = math.Min(lo, bound)
	}
	if hi-lo < 1e-9 {
		hi = lo + 1
	}
	rowOf := func(y float64) int {
		return int(math.Round((hi - y) / (hi - lo) * float64(height-1)))
	}
	grid := make([][]byte, height)
	for r := range grid {
		grid[r] = []byte(strings.Repeat(" ", cols))
	}
	if bound > 0 {
		br := rowOf(bound)
		for c := range cols {
			grid[br][c] = '-'
		}
	}
	for c, y := range ys {
		grid[rowOf(y)][c] = '*'
	}
	fmt.Fprintf(w, "\nloss (each column %s steps", si(float64(n)/float64(cols)))
	if bound > 0 {
		fmt.Fprint(w, "; dashes: the best possible loss")
	}
	fmt.Fprintln(w, ")")
	for r, line := range grid {
		label := "       "
		if r == 0 || r == height-1 || r == height/2 {
			label = fmt.Sprintf("%7.3f", hi-(hi-lo)*float64(r)/float64(height-1))
		}
		fmt.Fprintf(w, "%s |%s\n", label, line)
	}
	fmt.Fprintf(w, "%7s +%s\n%9s%*d\n", "", strings.Repeat("-", cols), "1", cols-1, n)
}

// printRow prints the mean loss of a stretch of steps and its last
// evaluation.
func printRow(w io.Writer, rs []stepRecord) {
	var s float64
	eval := "-"
	for _, r := range rs {
		s += r.Loss
		if r.EvalLoss != nil {
			eval = fmt.Sprintf("%.4f", *r.EvalLoss)
		}
	}
	last := rs[len(rs)-1]
	fmt.Fprintf(w, "%8d %10s %10.4f %10s %10.2e\n", last.Step, si(float64(last.Tokens)), s/float64(len(rs)), eval, last.LR)
}
