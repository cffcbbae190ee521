package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/peer/api"
)

func init() { register(newTestnetCmd) }

type testnetFlags struct {
	nodes   int
	swarm   string
	keep    bool
	asJSON  bool
	dataDir string
	timeout time.Duration
}

func newTestnetCmd() *cobra.Command {
	var f testnetFlags
	cmd := &cobra.Command{
		Use:   "testnet",
		Short: "Start a local swarm of holopeer processes on loopback and show it working",
		Long: `testnet starts a swarm of 'holopeer up' processes on 127.0.0.1 (the first is
the bootstrap), waits until every node has found every other one through the
private DHT, prints what each node sees, and stops them all. --keep leaves the
swarm running until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runTestnet(cmd, f) },
	}
	fl := cmd.Flags()
	fl.IntVar(&f.nodes, "nodes", 4, "number of nodes")
	fl.StringVar(&f.swarm, "swarm", "testnet", "swarm name")
	fl.BoolVar(&f.keep, "keep", false, "keep the swarm running until interrupted")
	fl.BoolVar(&f.asJSON, "json", false, "print the summary as JSON")
	fl.StringVar(&f.dataDir, "data-dir", "", "where the nodes keep their state (default: a temporary directory, removed afterwards)")
	fl.DurationVar(&f.timeout, "timeout", 2*time.Minute, "give up if the swarm has not formed by then")
	return cmd
}

// localNode is one child process of a testnet.
type localNode struct {
	name string
	cmd  *exec.Cmd
	api  string
	addr string // dialable multiaddr with /p2p/ID
	id   string
	done chan struct{}
	logs *os.File
}

func runTestnet(cmd *cobra.Command, f testnetFlags) error {
	if f.nodes < 2 || f.nodes > 32 {
		return fmt.Errorf("--nodes %d: use 2 to 32", f.nodes)
	}
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	dir := f.dataDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "holopeer-testnet-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	progress := func(format string, a ...any) {
		if !f.asJSON {
			fmt.Fprintf(out, format+"\n", a...)
		}
	}
	start := time.Now()
	var nodes []*localNode
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	for i := 0; i < f.nodes; i++ {
		boot := ""
		if i > 0 {
			boot = nodes[0].addr
		}
		n, err := startLocalNode(ctx, self, filepath.Join(dir, fmt.Sprintf("node%d", i)), fmt.Sprintf("node%d", i), f.swarm, boot)
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
		progress("started %s  %s", n.name, n.id)
	}
	progress("waiting for every node to find the other %d ...", f.nodes-1)
	wctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	var views []api.Status
	for {
		views = views[:0]
		complete := true
		for _, n := range nodes {
			st, err := api.Client{Addr: n.api}.Status(wctx)
			if err != nil {
				complete = false
				break
			}
			views = append(views, st)
			if len(st.Peers) < f.nodes-1 {
				complete = false
			}
		}
		if complete {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the swarm did not form within %v; node logs are in %s", f.timeout, dir)
		case <-time.After(200 * time.Millisecond):
		}
	}
	formed := time.Since(start)
	summary := testnetSummary{Nodes: len(nodes), FormedIn: formed.Round(time.Millisecond).String()}
	for i, st := range views {
		summary.Members = append(summary.Members, testnetMember{Name: nodes[i].name, PeerID: st.PeerID, API: nodes[i].api, Sees: len(st.Peers)})
	}
	if f.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(summary); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "swarm %q formed in %v: every node sees the other %d\n", f.swarm, formed.Round(time.Millisecond), f.nodes-1)
		for _, m := range summary.Members {
			fmt.Fprintf(out, "  %-6s %s  api %s  sees %d peers\n", m.Name, m.PeerID, m.API, m.Sees)
		}
	}
	if f.keep {
		progress("swarm running; try: holopeer status --api %s   (Ctrl-C stops it)", nodes[0].api)
		<-ctx.Done()
	}
	return nil
}

type testnetMember struct {
	Name   string `json:"name"`
	PeerID string `json:"peer_id"`
	API    string `json:"api"`
	Sees   int    `json:"sees"`
}

type testnetSummary struct {
	Nodes    int             `json:"nodes"`
	FormedIn string          `json:"formed_in"`
	Members  []testnetMember `json:"members"`
}

var bannerAddrRE = regexp.MustCompile(`^\s+address\s+(/ip4/127\.0\.0\.1/\S+/p2p/(\S+))`)

// startLocalNode runs `holopeer up` on loopback with ephemeral ports and
// waits for it to print its address.
func startLocalNode(ctx context.Context, self, dataDir, name, swarm, boot string, extra ...string) (*localNode, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	apiAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"up", "--data-dir", dataDir, "--swarm", swarm, "--listen", "/ip4/127.0.0.1/tcp/0", "--api", apiAddr}
	if boot != "" {
		args = append(args, "--bootstrap", boot)
	}
	args = append(args, extra...)
	logs, err := os.Create(filepath.Join(dataDir, "node.log"))
	if err != nil {
		return nil, err
	}
	c := exec.Command(self, args...)
	c.Stderr = logs
	stdout, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	n := &localNode{name: name, cmd: c, api: apiAddr, done: make(chan struct{}), logs: logs}
	found := make(chan struct{})
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := bannerAddrRE.FindStringSubmatch(sc.Text()); m != nil && n.addr == "" {
				n.addr, n.id = m[1], m[2]
				once.Do(func() { close(found) })
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() { c.Wait(); close(n.done) }()
	select {
	case <-found:
		return n, nil
	case <-n.done:
		b, _ := os.ReadFile(logs.Name())
		return nil, fmt.Errorf("%s exited at start: %s", name, lastNonEmptyLine(string(b)))
	case <-time.After(30 * time.Second):
		n.stop()
		return nil, fmt.Errorf("%s did not start within 30 s; see %s", name, logs.Name())
	case <-ctx.Done():
		n.stop()
		return nil, ctx.Err()
	}
}

func (n *localNode) stop() {
	select {
	case <-n.done:
	default:
		n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			n.cmd.Process.Kill()
			<-n.done
		}
	}
	n.logs.Close()
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func lastNonEmptyLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
