//go:build linux

package netem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Link is two namespaces joined by an emulated link: side 0 at Addr[0],
// side 1 at Addr[1].
type Link struct {
	NS   [2]string
	Addr [2]netip.Addr
	Mode string
	Cfg  Config

	emu     *emulator // userspace mode only
	sigStop func()
	once    sync.Once
	err     error
}

// Available reports why Setup would fail before it touches anything.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (network namespaces, veth/TUN devices, tc)", ErrUnavailable)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: iproute2 `ip` not found", ErrUnavailable)
	}
	return nil
}

// Names are hpw<pid>n<seq>a and …b: unique per process and per Setup,
// at most 15 bytes (the kernel's limit for device names).
var (
	ourName = regexp.MustCompile(`^hpw([0-9]+)n[0-9]+[ab]$`)
	setups  atomic.Int64
)

// Setup builds the link. Close it when done.
func Setup(ctx context.Context, cfg Config) (_ *Link, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	sweepStale(ctx)
	pid, seq := os.Getpid(), setups.Add(1)%1000
	l := &Link{
		NS:   [2]string{fmt.Sprintf("hpw%dn%da", pid, seq), fmt.Sprintf("hpw%dn%db", pid, seq)},
		Addr: [2]netip.Addr{netip.MustParseAddr("10.201.0.1"), netip.MustParseAddr("10.201.0.2")},
		Cfg:  cfg,
	}
	l.catchSignals()
	defer func() {
		if err != nil {
			_ = l.Close()
		}
	}()
	for _, ns := range l.NS {
		if err := ip(ctx, "netns", "add", ns); err != nil {
			return nil, err
		}
		if err := ip(ctx, "-n", ns, "link", "set", "lo", "up"); err != nil {
			return nil, err
		}
	}
	if !cfg.ForceUserspace {
		switch err := l.setupVeth(ctx); {
		case err == nil:
			l.Mode = ModeNetem
			return l, nil
		case !errors.Is(err, errNoNetem):
			return nil, err
		}
	}
	if err := l.setupTUN(ctx); err != nil {
		return nil, fmt.Errorf("%w: tc netem is missing and the TUN fallback failed: %v", ErrUnavailable, err)
	}
	l.Mode = ModeUserspace
	return l, nil
}

var errNoNetem = errors.New("netem: kernel has no netem qdisc")

func (l *Link) setupVeth(ctx context.Context) error {
	a, b := l.NS[0], l.NS[1] // device names equal namespace names
	if err := ip(ctx, "link", "add", a, "type", "veth", "peer", "name", b); err != nil {
		return err
	}
	for i, ns := range l.NS {
		if err := ip(ctx, "link", "set", ns, "netns", ns); err != nil {
			return err
		}
		if err := ip(ctx, "-n", ns, "addr", "add", l.Addr[i].String()+"/30", "dev", ns); err != nil {
			return err
		}
		if err := ip(ctx, "-n", ns, "link", "set", ns, "up"); err != nil {
			return err
		}
	}
	for _, ns := range l.NS {
		out, err := run(ctx, "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns, "root", "netem",
			"rate", fmt.Sprintf("%gmbit", l.Cfg.RateMbit), "delay", fmt.Sprintf("%dus", l.Cfg.Delay.Microseconds()), "limit", "1000")
		if err != nil {
			if strings.Contains(out, "unknown") || strings.Contains(out, "No such file") {
				// Take the veth down again so the fallback starts clean.
				_ = ip(ctx, "-n", a, "link", "del", a)
				return fmt.Errorf("%w: %s", errNoNetem, strings.TrimSpace(out))
			}
			return fmt.Errorf("netem: tc: %w: %s", err, strings.TrimSpace(out))
		}
	}
	return nil
}

func (l *Link) setupTUN(ctx context.Context) error {
	var devs [2]*os.File
	for i, ns := range l.NS {
		f, err := openTUN(ns)
		if err != nil {
			for _, d := range devs {
				if d != nil {
					_ = d.Close()
				}
			}
			return err
		}
		devs[i] = f
	}
	l.emu = newEmulator(devs, l.Cfg)
	for i, ns := range l.NS {
		if err := ip(ctx, "link", "set", ns, "netns", ns); err != nil {
			return err
		}
		peerAddr := l.Addr[1-i].String()
		if err := ip(ctx, "-n", ns, "addr", "add", l.Addr[i].String(), "peer", peerAddr, "dev", ns); err != nil {
			return err
		}
		if err := ip(ctx, "-n", ns, "link", "set", ns, "mtu", "1500", "up"); err != nil {
			return err
		}
	}
	l.emu.start()
	return nil
}

// Command returns a command that runs name with args inside side's
// namespace.
func (l *Link) Command(ctx context.Context, side int, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.NS[side], name}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Close removes the namespaces and stops the emulator. It is safe to call
// more than once and from a signal.
func (l *Link) Close() error {
	l.once.Do(func() {
		if l.sigStop != nil {
			l.sigStop()
		}
		if l.emu != nil {
			l.emu.stop()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var errs []error
		for _, ns := range l.NS {
			if nsExists(ctx, ns) {
				if err := ip(ctx, "netns", "del", ns); err != nil {
					errs = append(errs, err)
				}
			}
		}
		l.err = errors.Join(errs...)
	})
	return l.err
}

// catchSignals removes the link if the process is interrupted, then lets
// the signal take its usual course.
func (l *Link) catchSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	var once sync.Once
	l.sigStop = func() { once.Do(func() { signal.Stop(ch); close(done) }) }
	go func() {
		select {
		case sig := <-ch:
			_ = l.Close()
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Signal(sig)
			}
		case <-done:
		}
	}()
}

// sweepStale removes namespaces this package created in runs whose process
// no longer exists.
func sweepStale(ctx context.Context) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		m := ourName.FindStringSubmatch(f[0])
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || processAlive(pid) {
			continue
		}
		_ = ip(ctx, "netns", "del", f[0])
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func nsExists(ctx context.Context, ns string) bool {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return true // try the delete anyway
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == ns {
			return true
		}
	}
	return false
}

func ip(ctx context.Context, args ...string) error {
	out, err := run(ctx, "ip", args...)
	if err != nil {
		return fmt.Errorf("netem: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out))
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
