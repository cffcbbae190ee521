package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/pipeline"
)

// A tiny dense job: four stages, fp32 on the wire, a checkpoint every two
// steps, so a process killed at step 3 rolls the swarm back to step 2.
const tinySwarmJob = `name: tiny
tokenizer: byte
model: {dim: 32, layers: 4, heads: 4, kv_heads: 2, ffn_dim: 64, max_seq: 16}
data: {synthetic: {seed: 3}}
train:
  steps: 8
  seq_len: 16
  batch_tokens: 128
  microbatches: 4
  seed: 5
  optimizer: {lr: 0.003, min_lr: 0.0003, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0}
pipeline: {stages: 4, replicas_per_stage: 1, codec: fp32}
checkpoint: {interval: 2}
`

func readLosses(t *testing.T, path string) []float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r stepRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if r.Event != "" && r.Event != "step" {
			continue
		}
		for len(out) >= r.Step && len(out) > 0 { // a rollback re-runs steps
			out = out[:len(out)-1]
		}
		out = append(out, r.Loss)
	}
	return out
}

// TestTestnetMatchesLocalAndSurvivesAKill: `holopeer testnet` trains a
// dense job across four stage processes (plus a spare), one of which is
// killed after step 3. The run recovers on the spare and completes; its
// loss curve equals `holopeer train --local` on the same manifest, and
// every step log replays to each step committed exactly once.
func TestTestnetMatchesLocalAndSurvivesAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a swarm of processes")
	}
	dir := t.TempDir()
	man := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(man, []byte(tinySwarmJob), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	local := filepath.Join(dir, "local")
	if out, err := exec.CommandContext(ctx, binPath, "train", "--local", man, "--out", local, "--json").CombinedOutput(); err != nil {
		t.Fatalf("train --local: %v\n%s", err, out)
	}
	want := readLosses(t, filepath.Join(local, "loss.jsonl"))

	swarm := filepath.Join(dir, "swarm")
	cmd := exec.CommandContext(ctx, binPath, "testnet", "--manifest", man, "--nodes", "5", "--kill-stage-at", "3", "--json", "--data-dir", swarm, "--swarm", "tiny")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("testnet: %v\nstderr:\n%s", err, tail(stderr.String(), 40))
	}
	var sum testnetSummary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("summary: %v\n%s", err, stdout.String())
	}
	if sum.Recoveries != 1 || sum.Killed == "" || sum.Steps != 8 || len(sum.Stages) != 4 {
		t.Fatalf("summary %+v", sum)
	}
	seen := map[string]bool{}
	for _, s := range sum.Stages {
		for _, r := range s.Replicas {
			if seen[r] {
				t.Fatalf("peer %s holds two stages", r)
			}
			seen[r] = true
		}
	}
	if !sum.Coordinator.Insecure || sum.Coordinator.TEE != "sim" {
		t.Fatalf("coordinator %+v: the testnet runs the sim TEE, which must be marked insecure", sum.Coordinator)
	}

	got := readLosses(t, filepath.Join(swarm, "run", "loss.jsonl"))
	if len(got) != len(want) {
		t.Fatalf("swarm logged %d steps, local %d", len(got), len(want))
	}
	for i := range want {
		if rel := math.Abs(got[i]-want[i]) / want[i]; rel > 1e-5 {
			t.Fatalf("step %d: swarm loss %.7f, local %.7f (rel %.2g)", i+1, got[i], want[i], rel)
		}
	}
	if got[len(got)-1] >= got[0] {
		t.Fatalf("loss did not fall: %v", got)
	}

	// Every node's step log, the researcher's and each stage's, commits
	// each step exactly once.
	logs, _ := filepath.Glob(filepath.Join(swarm, "*", "jobs", "*", "*-steps.jsonl"))
	logs = append(logs, filepath.Join(swarm, "run", "steps.jsonl"))
	if len(logs) < 5 {
		t.Fatalf("found only %d step logs: %v", len(logs), logs)
	}
	for _, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		events, err := pipeline.ReadStepLog(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := pipeline.CheckExactlyOnce(events)
		if err != nil {
			t.Fatalf("%s: %v\n%s", path, err, b)
		}
		last := committed[len(committed)-1]
		if strings.HasSuffix(path, filepath.Join("run", "steps.jsonl")) && last != 8 {
			t.Fatalf("researcher committed up to step %d, want 8", last)
		}
	}
	if _, err := os.Stat(filepath.Join(swarm, "run", "final", "model.safetensors")); err != nil {
		t.Fatalf("no final checkpoint: %v", err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
