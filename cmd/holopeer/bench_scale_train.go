package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// scaleTrainNodes lend to the training job: three stages and a spare that
// takes over the stage the bench kills after the first checkpoint.
const scaleTrainNodes = 4

// benchScaleTrain trains a ~300M-parameter model (d 1024, 33 layers; with
// --quick a small one) across three `holopeer up` processes with the
// subspace codec, against `holopeer train --local` on the same manifest.
// After the first checkpoint (each stage's shard is over 1 GiB) it kills a
// stage node, so the run also shows the shards coming home and a resume
// from them on the spare.
func benchScaleTrain(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "holopeer-scale-train-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// 33 blocks: 295M trainable parameters under the subspace constraint
	// (k×d factors replace the output projections), 11 a stage, so a
	// stage's shard is over 1 GiB.
	name, model, steps, every := "300m", "{dim: 1024, layers: 33, heads: 16, kv_heads: 16, ffn_dim: 2816, max_seq: 64}", 20, 10
	if o.Quick {
		// Long enough (tens of ms a step) for the kill to land mid-run.
		name, model, steps, every = "quick", "{dim: 128, layers: 6, heads: 4, kv_heads: 2, ffn_dim: 344, max_seq: 64}", 40, 4
	}
	pre := "scale.train_" + name + "."
	man := filepath.Join(dir, "train.yaml")
	yaml := fmt.Sprintf(`name: scale-train
tokenizer: byte
model: %s
data:
  synthetic: {seed: 1}
train:
  steps: %d
  seq_len: 64
  batch_tokens: 256
  microbatches: 4
  seed: 1
  optimizer: {lr: 0.001, warmup_steps: 2}
pipeline:
  stages: 3
  replicas_per_stage: 1
  codec: subspace
  rank: 32
  subspace_seed: 7
checkpoint:
  interval: %d
`, model, steps, every)
	if err := os.WriteFile(man, []byte(yaml), 0o600); err != nil {
		return err
	}
	m, err := manifest.Load(man)
	if err != nil {
		return err
	}
	spec, err := pipeline.SpecFor(m, tokenizer.Byte())
	if err != nil {
		return err
	}
	perBlock, fixed := spec.LayerBytes(spec.Stages), spec.StageBytes()
	blocksPerStage := (spec.Model.Layers + spec.Stages - 1) / spec.Stages
	lend := int64(fixed+uint64(blocksPerStage+1)*perBlock) * 5 / 4

	progress("scale: training %s parameters for %d steps in one process", si(float64(spec.Model.ParamCount())), steps)
	local, err := runChild(ctx, exe, "train", "--local", man, "--out", filepath.Join(dir, "local"), "--json", "--eval-every", strconv.Itoa(steps), "--eval-batches", "1")
	if err != nil {
		return err
	}
	var ls trainSummary
	for _, line := range strings.Split(strings.TrimSpace(string(local.stdout)), "\n") {
		var ev trainSummary
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "done" {
			ls = ev
		}
	}
	if ls.Steps == 0 {
		return fmt.Errorf("train --local printed no summary: %s", lastLines(string(local.stdout), 5))
	}

	sw, err := startScaleSwarm(ctx, exe, dir, lend, scaleTrainNodes)
	if err != nil {
		return err
	}
	defer sw.stop()
	out := filepath.Join(dir, "run")
	progress("scale: training across %d nodes lending %d MiB each", scaleTrainNodes, lend>>20)
	run, err := startChild(exe, "run", man, "--out", out, "--json", "--data-dir", filepath.Join(dir, "researcher"), "--swarm", "scale-bench",
		"--bootstrap", sw.boot, "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "off", "--allow-sim",
		"--port-mapping=false", "--relay=false", "--log-level", "warn")
	if err != nil {
		return err
	}
	sw.others = append(sw.others, run)
	killed, err := killAfterCheckpoint(ctx, run, out, every, sw)
	if err != nil {
		return err
	}
	<-run.done
	if run.cmd.ProcessState.ExitCode() != 0 {
		return fmt.Errorf("holopeer run failed: %s", lastLines(run.output(), 20))
	}
	var sum runSummary
	text := run.output()
	if i := strings.Index(text, "{\n"); i >= 0 {
		if err := json.Unmarshal([]byte(text[i:strings.LastIndex(text, "}")+1]), &sum); err != nil {
			return fmt.Errorf("run --json: %w", err)
		}
	}
	sw.stop()

	emit(row(pre+"params", float64(spec.Model.ParamCount()), "params", 0))
	emit(row(pre+"s_per_step", sum.Elapsed/float64(max(sum.Steps, 1)), "s", ls.Elapsed/float64(max(ls.Steps, 1))))
	r := row(pre+"tokens_per_s", sum.TokensPerS, "tokens/s", ls.TokensPerS)
	r.Note = "swarm (3 stage processes and the researcher on this one machine, with one recovery) against train --local"
	emit(r)
	emit(row(pre+"recoveries", float64(sum.Recoveries), "count", 1))
	shard, err := largestShard(filepath.Join(out, "checkpoints"))
	if err != nil {
		return err
	}
	emit(row(pre+"checkpoint_shard_bytes", float64(shard), "bytes", 1<<30))
	emit(row(pre+"local.peak_rss_bytes", float64(local.rss), "bytes", 0))
	for i, n := range sw.nodes {
		blocks := 0
		for _, s := range sum.Stages {
			if strings.Contains(strings.Join(s.Replicas, ","), n.id) {
				var a, b int
				fmt.Sscanf(s.Blocks, "%d-%d", &a, &b)
				blocks += b - a + 1
			}
		}
		est := 0.0
		note := fmt.Sprintf("%d blocks at the end (baseline: the memory estimate)", blocks)
		if blocks > 0 {
			est = float64(fixed + uint64(blocks)*perBlock)
		}
		if n == killed {
			note = "killed after the first checkpoint (its stage moved to the spare)"
			est = float64(fixed + uint64(blocksPerStage)*perBlock)
		}
		r := row(fmt.Sprintf("%snode%d.peak_rss_bytes", pre, i), float64(n.proc.rss), "bytes", est)
		r.Note = note
		emit(r)
	}
	r = row(pre+"researcher.peak_rss_bytes", float64(run.rss), "bytes", float64(fixed))
	r.Note = "its embedding and head, the shards coming home and final/ written, all streamed (baseline: one stage's fixed needs)"
	emit(r)
	if sum.Recoveries < 1 {
		return fmt.Errorf("the run reports no recovery after a stage node was killed")
	}
	return nil
}

var lossStepRE = regexp.MustCompile(`"step":(\d+)`)

// killAfterCheckpoint waits until the run has passed its first checkpoint
// (loss.jsonl two steps beyond it and the checkpoint on disk), then kills
// the node that holds the most memory: one with a stage, never the spare,
// and never node 0, the only coordinator candidate (killing it leaves the
// run without a coordinator to re-plan, which is not what this measures).
func killAfterCheckpoint(ctx context.Context, run *child, out string, every int, sw *scaleSwarm) (*scaleNode, error) {
	deadline := time.Now().Add(time.Hour)
	for time.Now().Before(deadline) {
		select {
		case <-run.done:
			return nil, fmt.Errorf("holopeer run ended before the kill: %s", lastLines(run.output(), 20))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if lastStep(filepath.Join(out, "loss.jsonl")) < every+1 {
			continue
		}
		if _, err := os.Stat(filepath.Join(out, "checkpoints", fmt.Sprintf("step-%06d", every), "manifest.json")); err != nil {
			continue
		}
		var victim *scaleNode
		var most int64
		for _, n := range sw.nodes[1:] {
			if rss := currentRSS(n.proc.cmd.Process.Pid); rss > most {
				victim, most = n, rss
			}
		}
		if victim == nil {
			return nil, fmt.Errorf("cannot read the nodes' memory to pick a stage node")
		}
		progress("scale: killing %s after step %d", victim.id, lastStep(filepath.Join(out, "loss.jsonl")))
		victim.proc.cmd.Process.Signal(syscall.SIGKILL)
		<-victim.proc.done
		return victim, nil
	}
	return nil, fmt.Errorf("the run did not pass its first checkpoint within an hour")
}

func lastStep(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	step := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := lossStepRE.FindStringSubmatch(sc.Text()); m != nil {
			step, _ = strconv.Atoi(m[1])
		}
	}
	return step
}

// currentRSS is a running process's resident set from /proc (0 elsewhere).
func currentRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// largestShard is the biggest stage shard in any checkpoint under dir.
func largestShard(dir string) (int64, error) {
	var most int64
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), "stage-") && strings.HasSuffix(d.Name(), ".safetensors") {
			info, err := d.Info()
			if err != nil {
				return err
			}
			most = max(most, info.Size())
		}
		return nil
	})
	return most, err
}
