package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
)

// runCLI runs holopeer in this process and returns what it printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// tinyJob is a manifest small enough to train in a second or two.
const tinyJob = `name: tiny
tokenizer: byte
model:
  dim: 32
  layers: 2
  heads: 2
  kv_heads: 1
  ffn_dim: 64
  max_seq: 16
data:
  synthetic:
    seed: 3
train:
  steps: 40
  seq_len: 16
  batch_tokens: 256
  microbatches: 2
  optimizer:
    lr: 0.01
    min_lr: 0.002
    warmup_steps: 4
    weight_decay: 0.1
    grad_clip: 1.0
pipeline:
  stages: 2
  codec: %CODEC%
checkpoint:
  interval: 15
`

func writeJob(t *testing.T, codec string) string {
	t.Helper()
	body := strings.Replace(tinyJob, "%CODEC%", codec, 1)
	if codec == "subspace" {
		body = strings.Replace(body, "  codec: subspace\n", "  codec: subspace\n  rank: 8\n  subspace_seed: 5\n", 1)
	}
	path := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTrainLocalLossFalls trains the tiny job dense and constrained and
// checks that the loss falls well below its start, every step is logged,
// and the checkpoint loads as the model that was trained.
func TestTrainLocalLossFalls(t *testing.T) {
	for _, codec := range []string{"fp32", "subspace"} {
		t.Run(codec, func(t *testing.T) {
			job := writeJob(t, codec)
			out := filepath.Join(t.TempDir(), "run")
			stdout, err := runCLI(t, "train", "--local", job, "--out", out, "--json")
			if err != nil {
				t.Fatal(err)
			}
			var steps []stepRecord
			var sum trainSummary
			sc := bufio.NewScanner(strings.NewReader(stdout))
			for sc.Scan() {
				var ev struct{ Event string }
				json.Unmarshal(sc.Bytes(), &ev)
				switch ev.Event {
				case "step":
					var r stepRecord
					if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
						t.Fatal(err)
					}
					steps = append(steps, r)
				case "done":
					if err := json.Unmarshal(sc.Bytes(), &sum); err != nil {
						t.Fatal(err)
					}
				default:
					t.Fatalf("unexpected line %q", sc.Text())
				}
			}
			if len(steps) != 40 || sum.Steps != 40 || sum.Tokens != 40*256 {
				t.Fatalf("%d step events, summary %+v", len(steps), sum)
			}
			first, last := steps[0].Loss, sum.FinalLoss
			t.Logf("loss %.3f → %.3f, held-out %.3f, bound %.3f", first, last, sum.EvalLoss, sum.WindowBound)
			if !(last < first-1.5) || !(sum.EvalLoss < first-1.5) {
				t.Errorf("loss fell from %.3f to %.3f (held-out %.3f): not learning", first, last, sum.EvalLoss)
			}
			if sum.WindowBound <= 1 || sum.WindowBound >= sum.EvalLoss || sum.EvalOptimal <= 1 || sum.Constrained != (codec == "subspace") {
				t.Errorf("summary %+v", sum)
			}
			logged, err := os.ReadFile(filepath.Join(out, runLossLog))
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(logged), "\n"); n != 40 || !strings.Contains(string(logged), `"grad_norm"`) {
				t.Errorf("loss log has %d lines:\n%s", n, logged)
			}
			st, err := checkpoint.ReadState(filepath.Join(out, runCheckpointDir))
			if err != nil || st.Step != 40 || st.Tokens != 40*256 || !strings.Contains(string(st.Data), "synthetic_windows") {
				t.Errorf("trainer state %+v, %v", st, err)
			}
			// The checkpoint evaluates to the loss the run reported.
			ck, err := checkpoint.Open(filepath.Join(out, runCheckpointDir))
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if tc := ck.TrainingConfig(); tc.Subspace.Enabled() != (codec == "subspace") {
				t.Errorf("checkpoint config %+v", tc)
			}
		})
	}
}

func TestTrainLocalPrintsCurveAndBound(t *testing.T) {
	job := writeJob(t, "fp32")
	stdout, err := runCLI(t, "train", "--local", job, "--out", filepath.Join(t.TempDir(), "run"), "--steps", "12", "--eval-every", "4")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"parameters", "step  4/12", "loss (each column", "best possible:", "gap: held-out loss is", "checkpoint:"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestTrainLocalErrors(t *testing.T) {
	job := writeJob(t, "fp32")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("model:\n  dim: 30\n  heads: 4\n"), 0o600)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"train", job}, "holopeer run"},
		{[]string{"train", "--local", bad}, "model.heads"},
		{[]string{"train", "--local", job, "--steps", "-3"}, "--steps"},
		{[]string{"train", "--local", filepath.Join(t.TempDir(), "none.yaml")}, "no such file"},
	}
	for _, c := range cases {
		if _, err := runCLI(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error mentioning %q", c.args, err, c.want)
		}
	}
	// The binary reports it on one line, without a stack trace.
	out, err := exec.Command(binPath, "train", "--local", bad).CombinedOutput()
	if err == nil || !strings.HasPrefix(string(out), "holopeer: ") || strings.Count(string(out), "\n") != 1 {
		t.Errorf("exit %v, output %q", err, out)
	}
}
