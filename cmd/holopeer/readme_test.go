package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeBlock returns the command lines of the first ```sh block in the
// README section with the given heading, comments and blank lines left
// out.
func readmeBlock(t *testing.T, readme, heading string) []string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	sec := readme[i+len(heading)+2:]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	a := strings.Index(sec, "```sh\n")
	if a < 0 {
		t.Fatalf("%s: no sh block", heading)
	}
	sec = sec[a+len("```sh\n"):]
	sec = sec[:strings.Index(sec, "```")]
	var out []string
	for _, l := range strings.Split(sec, "\n") {
		if k := strings.Index(l, "#"); k >= 0 {
			l = l[:k]
		}
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// README placeholders the recipe test replaces: the first node's address
// and its ports, which on one machine every node would otherwise share.
const (
	readmeBootstrap = "/ip4/192.168.1.10/tcp/7600/p2p/12D3KooW…"
	readmePort      = "7600"
	readmeAPIPort   = "7601"
)

// machine is one of the README's machines: a HOME of its own (so
// ~/.holopeer is its own) and a port base.
type machine struct {
	home string
	port int
}

func (m machine) subst(line, boot string) string {
	line = strings.ReplaceAll(line, readmeBootstrap, boot)
	line = strings.ReplaceAll(line, readmeAPIPort, fmt.Sprint(m.port+1))
	return strings.ReplaceAll(line, readmePort, fmt.Sprint(m.port))
}

// shell runs a README line with sh in dir as machine m would.
func (m machine) shell(dir, line string) *exec.Cmd {
	cmd := exec.Command("sh", "-c", "exec "+line)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+m.home)
	return cmd
}

func startLine(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout = lockedWriter{&p.mu, &p.stdout}
	cmd.Stderr = lockedWriter{&p.mu, &p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s\nstdout:\n%s\nstderr:\n%s", strings.Join(cmd.Args, " "), tail(p.out(), 3000), tail(p.errOut(), 3000))
		}
	})
	return p
}

// waitOutput waits until p's stdout holds want.
func waitOutput(t *testing.T, p *proc, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.out(), want) {
		select {
		case <-p.done:
			t.Fatalf("%v exited before printing %q: %s", p.cmd.Args, want, tail(p.errOut(), 2000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v printed no %q within %v", p.cmd.Args, want, d)
		}
	}
}

// TestReadmeRecipe runs the README's "Lending a machine" and "Training and
// serving" commands verbatim, as processes on loopback: each machine a
// HOME of its own, only the first node's address and the port base
// substituted. A README command that fails as written fails this test.
func TestReadmeRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the demo across four node processes")
	}
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	lend := readmeBlock(t, readme, "## Lending a machine")
	train := readmeBlock(t, readme, "## Training and serving")
	find := func(lines []string, pred func(string) bool, what string) string {
		t.Helper()
		for _, l := range lines {
			if pred(l) {
				return l
			}
		}
		t.Fatalf("README has no %s line in %q", what, lines)
		return ""
	}
	has := func(sub ...string) func(string) bool {
		return func(l string) bool {
			for _, s := range sub {
				if !strings.Contains(l, s) {
					return false
				}
			}
			return true
		}
	}
	if len(lend) != 4 || len(train) != 5 {
		t.Fatalf("the README's recipe changed shape (%d lending, %d training lines): update this test with it", len(lend), len(train))
	}
	build := find(lend, has("go build"), "build")
	if build != "go build -o holopeer ./cmd/holopeer" {
		t.Fatalf("build line %q: this test builds the same binary once in TestMain", build)
	}
	first := find(lend, func(l string) bool { return has("holopeer up")(l) && !strings.Contains(l, "--bootstrap") }, "first up")
	other := find(lend, has("holopeer up", "--bootstrap"), "other up")
	status := find(lend, has("holopeer status"), "status")

	// The working directory of every machine: the binary the build line
	// makes, and the repository's testnet manifests.
	dir := t.TempDir()
	if err := os.Symlink(binPath, filepath.Join(dir, "holopeer")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "testnet"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"demo.yaml", "local.yaml", "serve.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../testnet", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "testnet", f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	newMachine := func() machine {
		// Two ports: the node and, at port+1, its API.
		p := freePort(t)
		for freePortAt(p+1) != nil {
			p = freePort(t)
		}
		return machine{home: t.TempDir(), port: p}
	}

	m0 := newMachine()
	p0 := startLine(t, m0.shell(dir, m0.subst(first, "")))
	boot := waitAddr(t, p0)
	for i := 0; i < 3; i++ {
		m := newMachine()
		waitAddr(t, startLine(t, m.shell(dir, m.subst(other, boot))))
	}
	eventually(t, 60*time.Second, "status shows the sim coordinator", func() error {
		out, err := m0.shell(dir, m0.subst(status, boot)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", status, err, out)
		}
		if !strings.Contains(string(out), "INSECURE") {
			return fmt.Errorf("no INSECURE coordinator yet:\n%s", out)
		}
		return nil
	})

	researcher := machine{home: t.TempDir()}
	// The reference trainer runs 900 steps: see it train, then stop it.
	local := startLine(t, researcher.shell(dir, find(train, has("train --local"), "train")))
	waitOutput(t, local, "loss", 3*time.Minute)
	local.cmd.Process.Signal(syscall.SIGTERM)

	run := find(train, has("holopeer run"), "run")
	start := time.Now()
	out, err := researcher.shell(dir, researcher.subst(run, boot)).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", run, err, tail(string(out), 4000))
	}
	for _, want := range []string{"INSECURE", "final model:"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("%s printed no %q:\n%s", run, want, tail(string(out), 4000))
		}
	}
	t.Logf("run: %v", time.Since(start).Round(time.Second))

	gen := find(train, has("holopeer generate"), "generate")
	if out, err := researcher.shell(dir, gen).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", gen, err, out)
	}

	serve := startLine(t, researcher.shell(dir, researcher.subst(find(train, has("holopeer serve"), "serve"), boot)))
	waitOutput(t, serve, "OpenAI-compatible API on http://127.0.0.1:8000", 3*time.Minute)
	resp, err := http.Get("http://127.0.0.1:8000/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models: %s", resp.Status)
	}

	ledger := find(train, has("holopeer ledger"), "ledger")
	if out, err := m0.shell(dir, ledger).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", ledger, err, out)
	}
}

// freePortAt says whether TCP port p on 127.0.0.1 is free (nil) now.
func freePortAt(p int) error {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return err
	}
	return l.Close()
}
