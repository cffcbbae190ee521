package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// binPath is a holopeer binary built once for the process tests.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "holopeer-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "holopeer")
	out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build holopeer: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a holopeer process under test.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// startProc runs holopeer with args until the test ends.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binPath, args...), done: make(chan struct{})}
	p.cmd.Stdout = lockedWriter{&p.mu, &p.stdout}
	p.cmd.Stderr = lockedWriter{&p.mu, &p.stderr}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("holopeer %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), p.out(), p.errOut())
		}
	})
	return p
}

func (p *proc) out() string    { p.mu.Lock(); defer p.mu.Unlock(); return p.stdout.String() }
func (p *proc) errOut() string { p.mu.Lock(); defer p.mu.Unlock(); return p.stderr.String() }

// freePort returns a TCP port that was free a moment ago on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var addrRE = regexp.MustCompile(`address\s+(/ip4/127\.0\.0\.1/\S+/p2p/\S+)`)

// waitAddr waits for a node to print its dialable address.
func waitAddr(t *testing.T, p *proc) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := addrRE.FindStringSubmatch(p.out()); m != nil {
			return m[1]
		}
		select {
		case <-p.done:
			t.Fatalf("node exited: %s", p.errOut())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("node printed no address")
	return ""
}

func statusOf(apiAddr string) (api.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return api.Client{Addr: apiAddr}.Status(ctx)
}

// eventually polls cond until it returns nil or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type testNode struct {
	p    *proc
	api  string
	addr string
	id   string
}

func upNode(t *testing.T, swarm string, boot string, extra ...string) *testNode {
	t.Helper()
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := []string{"up", "--data-dir", t.TempDir(), "--swarm", swarm,
		"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", freePort(t)), "--api", apiAddr}
	if boot != "" {
		args = append(args, "--bootstrap", boot)
	}
	args = append(args, extra...)
	p := startProc(t, args...)
	addr := waitAddr(t, p)
	return &testNode{p: p, api: apiAddr, addr: addr, id: addr[strings.LastIndex(addr, "/")+1:]}
}

func peerIDs(st api.Status) map[string]bool {
	out := map[string]bool{}
	for _, p := range st.Peers {
		out[p.PeerID] = true
	}
	return out
}

// TestThreeNodesFindEachOther: three `holopeer up` processes on loopback,
// the second and third bootstrapping from the first, each list the other
// two within 30 s; a stopped one disappears from the others within a
// minute.
func TestThreeNodesFindEachOther(t *testing.T) {
	a := upNode(t, "trio", "")
	b := upNode(t, "trio", a.addr)
	c := upNode(t, "trio", a.addr)
	nodes := []*testNode{a, b, c}
	took := eventually(t, 30*time.Second, "every node lists the other two", func() error {
		for _, n := range nodes {
			st, err := statusOf(n.api)
			if err != nil {
				return err
			}
			ids := peerIDs(st)
			for _, o := range nodes {
				if o != n && !ids[o.id] {
					return fmt.Errorf("%s does not list %s", n.id, o.id)
				}
			}
			if st.Swarm != "trio" || st.Coordinator != nil && st.Coordinator.PeerID == "" {
				return fmt.Errorf("bad status %+v", st)
			}
		}
		return nil
	})
	t.Logf("three nodes converged in %v", took)
	st, _ := statusOf(b.api)
	for _, p := range st.Peers {
		if p.Conn != "direct" {
			t.Errorf("peer %s conn %q on loopback", p.PeerID, p.Conn)
		}
	}
	c.p.cmd.Process.Signal(syscall.SIGTERM)
	<-c.p.done
	took = eventually(t, time.Minute, "the stopped node disappears", func() error {
		for _, n := range []*testNode{a, b} {
			st, err := statusOf(n.api)
			if err != nil {
				return err
			}
			if peerIDs(st)[c.id] {
				return fmt.Errorf("%s still lists %s", n.id, c.id)
			}
		}
		return nil
	})
	t.Logf("stopped node dropped in %v", took)
}

// TestBadInput: each mistake ends with one clear line on stderr, a
// non-zero exit and no stack trace.
func TestBadInput(t *testing.T) {
	a := upNode(t, "bad", "")
	taken := strings.TrimPrefix(a.addr[:strings.Index(a.addr, "/p2p/")], "")
	insecure := t.TempDir()
	if out, err := exec.Command(binPath, "keygen", "--data-dir", insecure).CombinedOutput(); err != nil {
		t.Fatalf("keygen: %v %s", err, out)
	}
	os.Chmod(filepath.Join(insecure, "identity.key"), 0o644)
	deadID := a.id
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unparsable multiaddr", []string{"--listen", "/ip4/127.0.0.1/tcp/notaport"}, "invalid listen address"},
		{"bootstrap without id", []string{"--bootstrap", "/ip4/127.0.0.1/tcp/1"}, "/p2p/"},
		{"unreachable bootstrap", []string{"--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/" + deadID}, "no bootstrap peer could be reached"},
		{"world-readable key", []string{"--data-dir", insecure}, "chmod 600"},
		{"port in use", []string{"--listen", taken}, "address already in use"},
		{"api port in use", []string{"--api", a.api}, "already in use"},
		{"bad swarm name", []string{"--swarm", "no spaces"}, "swarm"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"up", "--swarm", "bad", "--data-dir", t.TempDir(), "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", freePort(t)), "--api", fmt.Sprintf("127.0.0.1:%d", freePort(t))}
			args = append(args, tc.args...) // later flags win
			cmd := exec.Command(binPath, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-ctx.Done():
				cmd.Process.Kill()
				t.Fatalf("still running after 40 s; stderr: %s", stderr.String())
			}
			if err == nil {
				t.Fatalf("exit 0; stderr: %s", stderr.String())
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if strings.HasPrefix(l, "holopeer:") {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("want one 'holopeer:' line containing %q, got stderr:\n%s", tc.want, stderr.String())
			}
			if strings.Contains(stderr.String(), "goroutine ") || strings.Contains(stderr.String(), "panic") {
				t.Fatalf("stack trace on stderr:\n%s", stderr.String())
			}
		})
	}
}

func TestKeygenRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command(binPath, "keygen", "--data-dir", dir).Output()
	if err != nil || !strings.HasPrefix(string(out), "12D3Koo") {
		t.Fatalf("keygen: %v %q", err, out)
	}
	fi, _ := os.Stat(filepath.Join(dir, "identity.key"))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %04o", fi.Mode().Perm())
	}
	if err := exec.Command(binPath, "keygen", "--data-dir", dir).Run(); err == nil {
		t.Fatal("keygen overwrote a key")
	}
}

func TestHelpForEveryCommand(t *testing.T) {
	for _, c := range []string{"up", "status", "keygen", "version", "bench", "run", "testnet", "train", "generate", "serve", "ledger", "probe", "device"} {
		out, err := exec.Command(binPath, c, "--help").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage:") {
			t.Errorf("%s --help: %v\n%s", c, err, out)
		}
	}
}
