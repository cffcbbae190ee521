// Package natlab builds a NAT lab on one machine, with network namespaces,
// veth pairs and iptables, by driving testnet/nat/natlab.sh, and runs
// programs inside it. It needs root; Check says why it cannot run.
//
// The lab has an "internet" segment (7.7.7.0/24, a public-looking range
// that exists only inside the lab's namespaces) with one or more public
// machines, and home networks, each a private LAN behind a NAT router of a
// chosen type:
//
//	lab, err := natlab.Up(ctx, natlab.Config{Public: 2, Homes: []natlab.NAT{natlab.Easy, natlab.Symmetric}})
//	defer lab.Close()
//	cmd := lab.Command(ctx, lab.Homes[0].NS, "holopeer", "up", …)
//
// Close removes everything the lab created; CloseOnInterrupt does so when
// the process is interrupted too.
package natlab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// NAT is a home router's NAT type.
type NAT string

const (
	// Easy maps one local socket to one public port whatever the
	// destination (endpoint-independent mapping), as a typical home router
	// does. Hole punching works through it.
	Easy NAT = "easy"
	// Symmetric picks a new public port per destination
	// (endpoint-dependent mapping). Hole punching cannot work through it.
	Symmetric NAT = "symmetric"
)

// ErrUnavailable wraps every reason the lab cannot run on this machine.
var ErrUnavailable = errors.New("NAT lab unavailable")

// Config describes a lab.
type Config struct {
	Script string        // natlab.sh; default: testnet/nat/natlab.sh of this module
	Public int           // machines on the internet segment (default 1)
	Homes  []NAT         // one home network per entry, behind a router of that type
	Delay  time.Duration // extra round-trip time through each router (default none)
}

// Machine is a network namespace with one address.
type Machine struct {
	Name string // pub1, home2, …
	NS   string // network namespace
	IP   string
}

// Home is a private machine behind a NAT router.
type Home struct {
	Machine
	NAT      NAT
	RouterNS string
	WANIP    string // the router's public address: where the internet sees the home
}

// Lab is a running NAT lab.
type Lab struct {
	Prefix string
	Public []Machine
	Homes  []Home

	script    string
	closeOnce sync.Once
	closeErr  error
}

var labSeq atomic.Int64

// FindScript finds testnet/nat/natlab.sh in the module that holds the
// working directory.
func FindScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "testnet", "nat", "natlab.sh")
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%w: %s not found", ErrUnavailable, p)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no go.mod above the working directory", ErrUnavailable)
		}
		dir = parent
	}
}

// Check reports why a lab cannot run here: not root, no namespaces, no
// iptables NAT. It returns nil when it can.
func Check(script string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root for network namespaces and iptables", ErrUnavailable)
	}
	if script == "" {
		var err error
		if script, err = FindScript(); err != nil {
			return err
		}
	}
	out, err := exec.Command(script, "check").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", ErrUnavailable, strings.TrimSpace(string(out)))
	}
	return nil
}

// Up builds a lab. Its prefix is unique to this process and call, so labs
// of parallel tests do not meet.
func Up(ctx context.Context, cfg Config) (*Lab, error) {
	if cfg.Script == "" {
		var err error
		if cfg.Script, err = FindScript(); err != nil {
			return nil, err
		}
	}
	if cfg.Public == 0 {
		cfg.Public = 1
	}
	if len(cfg.Homes) == 0 {
		return nil, errors.New("natlab: at least one home network is needed")
	}
	prefix := fmt.Sprintf("hpnat%d.%d", os.Getpid(), labSeq.Add(1))
	args := []string{"up", "--prefix", prefix, "--public", strconv.Itoa(cfg.Public)}
	for _, h := range cfg.Homes {
		args = append(args, "--home", string(h))
	}
	if cfg.Delay > 0 {
		args = append(args, "--delay", strconv.Itoa(int(cfg.Delay/time.Millisecond)))
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, cfg.Script, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		// The script removes a half-built lab itself; make sure.
		_ = exec.Command(cfg.Script, "down", "--prefix", prefix).Run()
		return nil, fmt.Errorf("natlab up: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	l := &Lab{Prefix: prefix, script: cfg.Script}
	if err := l.parse(out); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// parse reads the script's KEY=VALUE lines.
func (l *Lab) parse(out []byte) error {
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	pub, err1 := strconv.Atoi(kv["NATLAB_PUBLIC"])
	homes, err2 := strconv.Atoi(kv["NATLAB_HOMES"])
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("natlab: unreadable lab description: %w\n%s", err, out)
	}
	for i := 1; i <= pub; i++ {
		k := fmt.Sprintf("PUB%d_", i)
		l.Public = append(l.Public, Machine{Name: fmt.Sprintf("pub%d", i), NS: kv[k+"NS"], IP: kv[k+"IP"]})
	}
	for i := 1; i <= homes; i++ {
		k := fmt.Sprintf("HOME%d_", i)
		l.Homes = append(l.Homes, Home{
			Machine:  Machine{Name: fmt.Sprintf("home%d", i), NS: kv[k+"NS"], IP: kv[k+"IP"]},
			NAT:      NAT(kv[k+"NAT"]),
			RouterNS: kv[k+"ROUTER_NS"],
			WANIP:    kv[k+"WAN_IP"],
		})
	}
	for _, m := range l.Public {
		if m.NS == "" || m.IP == "" {
			return fmt.Errorf("natlab: incomplete lab description:\n%s", out)
		}
	}
	for _, h := range l.Homes {
		if h.NS == "" || h.RouterNS == "" || h.WANIP == "" {
			return fmt.Errorf("natlab: incomplete lab description:\n%s", out)
		}
	}
	return nil
}

// Command runs name inside namespace ns.
func (l *Lab) Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Close stops what still runs inside the lab and removes its namespaces
// (and with them its interfaces). It is safe to call more than once.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		out, err := exec.Command(l.script, "down", "--prefix", l.Prefix).CombinedOutput()
		if err != nil {
			l.closeErr = fmt.Errorf("natlab down %s: %v: %s", l.Prefix, err, strings.TrimSpace(string(out)))
		}
	})
	return l.closeErr
}

// CloseOnInterrupt removes the lab if the process gets SIGINT or SIGTERM
// before stop is called, runs onSignal first (to stop the programs it
// started), then exits with status 2.
func (l *Lab) CloseOnInterrupt(onSignal func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			fmt.Fprintf(os.Stderr, "natlab: %v: removing lab %s\n", sig, l.Prefix)
			if onSignal != nil {
				onSignal()
			}
			l.Close()
			os.Exit(2)
		case <-done:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
	}
}
