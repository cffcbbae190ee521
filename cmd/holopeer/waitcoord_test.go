package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunSaysWhatIsWrong: run and serve, pointed at a swarm where no
// coordinator can be followed, exit within seconds (not after --timeout)
// naming the cause: a wrong --swarm, members that cannot stand, or a sim
// candidate this node refuses; and they print progress while they wait.
func TestRunSaysWhatIsWrong(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node processes")
	}
	// A dense checkpoint for serve, which loads it before waiting.
	ck := filepath.Join(t.TempDir(), "ck")
	if out, err := exec.Command(binPath, "checkpoint", "init", "--shape", "demo", ck).CombinedOutput(); err != nil {
		t.Fatalf("checkpoint init: %v\n%s", err, out)
	}
	serveMan := filepath.Join(t.TempDir(), "serve.yaml")
	if err := os.WriteFile(serveMan, []byte(fmt.Sprintf("name: t\ntokenizer: byte\nmodel:\n  checkpoint: %s\npipeline:\n  stages: 1\n  codec: bf16\n", ck)), 0o644); err != nil {
		t.Fatal(err)
	}
	demo, err := filepath.Abs("../../testnet/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lab := upNode(t, "lab", "", "--tee", "sim", "--allow-sim")
	voters := upNode(t, "voters", "", "--tee", "none")

	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"wrong swarm", []string{"run", demo, "--swarm", "holopeer", "--allow-sim", "--bootstrap", lab.addr},
			[]string{"no other member of the swarm found", `swarm "holopeer"`}},
		{"no candidate", []string{"run", demo, "--swarm", "voters", "--allow-sim", "--bootstrap", voters.addr},
			[]string{"no member can stand as coordinator", "--tee none"}},
		{"sim refused", []string{"run", demo, "--swarm", "lab", "--bootstrap", lab.addr},
			[]string{"refuses the candidates' evidence", "sim (INSECURE)", "--allow-sim"}},
		{"serve, sim refused", []string{"serve", serveMan, "--swarm", "lab", "--bootstrap", lab.addr, "--http", "127.0.0.1:0"},
			[]string{"refuses the candidates' evidence", "--allow-sim"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(c.args, "--data-dir", t.TempDir(), "--listen", "/ip4/127.0.0.1/tcp/0", "--timeout", "90s")
			start := time.Now()
			p := startProc(t, args...)
			select {
			case <-p.done:
			case <-time.After(60 * time.Second):
				t.Fatalf("still waiting after 60 s with --timeout 90s")
			}
			took := time.Since(start)
			stderr := p.errOut()
			if p.cmd.ProcessState.Success() {
				t.Fatalf("exited 0:\n%s", stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, tail(stderr, 2000))
				}
			}
			if !strings.Contains(stderr, "waiting for a coordinator") {
				t.Errorf("no progress line while waiting:\n%s", tail(stderr, 2000))
			}
			if strings.Contains(stderr, "is a node with --tee sim|snp|tdx in the swarm?") {
				t.Error("the old catch-all hint")
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			t.Logf("%s: said why in %v: %s", c.name, took.Round(100*time.Millisecond), lines[len(lines)-1])
		})
	}
}
