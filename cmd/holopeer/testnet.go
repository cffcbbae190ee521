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

	lpeer "github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/spf13/cobra"

	hpeer "github.com/holopeer/holopeer/peer"
	"github.com/holopeer/holopeer/peer/node"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/testnet"
)

func init() { register(newTestnetCmd) }

type testnetFlags struct {
	nodes       int
	swarm       string
	keep        bool
	asJSON      bool
	dataDir     string
	timeout     time.Duration
	manifest    string
	steps       int
	killStageAt int
	logLevel    string
	serve       bool
	http        string
}

func newTestnetCmd() *cobra.Command {
	var f testnetFlags
	cmd := &cobra.Command{
		Use:   "testnet",
		Short: "Start a local swarm on loopback and train a small model across it",
		Long: `testnet starts a swarm of 'holopeer up' processes on 127.0.0.1 (stage nodes
and a spare, with the insecure sim TEE on a swarm that allows it), waits for
them to find each other and elect a coordinator, then joins as the researcher
and trains the embedded demo model (testnet/demo.yaml: a small Llama-style
model on a synthetic corpus, subspace codec) across them. It prints the loss
falling and the bytes saved, ends with a summary, and stops the swarm.

--kill-stage-at STEP kills one stage node's process at that step to show the
run recovering on the spare; --json prints only the summary as JSON.
--serve then places the trained model on the swarm again, forward only, and
answers OpenAI-style requests on --http until interrupted, e.g.
  curl -N http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "the ", "max_tokens": 24, "temperature": 0, "stream": true}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runTestnet(cmd, f) },
	}
	fl := cmd.Flags()
	fl.IntVar(&f.nodes, "nodes", 4, "compute nodes to start (stages plus spares)")
	fl.StringVar(&f.swarm, "swarm", "testnet", "swarm name")
	fl.BoolVar(&f.keep, "keep", false, "keep the swarm running after the job until interrupted")
	fl.BoolVar(&f.asJSON, "json", false, "print only the summary, as JSON")
	fl.StringVar(&f.dataDir, "data-dir", "", "where the nodes keep their state and the run its outputs (default: a temporary directory, removed afterwards)")
	fl.DurationVar(&f.timeout, "timeout", 2*time.Minute, "give up if the swarm has not formed by then")
	fl.StringVar(&f.manifest, "manifest", "", "job manifest to train (default: the embedded testnet/demo.yaml)")
	fl.IntVar(&f.steps, "steps", 0, "override train.steps")
	fl.IntVar(&f.killStageAt, "kill-stage-at", 0, "kill one stage node's process after this step (0: never)")
	fl.StringVar(&f.logLevel, "log-level", "warn", "log level of the researcher's node (debug, info, warn, error)")
	fl.BoolVar(&f.serve, "serve", false, "after training, serve the trained model from the swarm behind the OpenAI-compatible API on --http until interrupted")
	fl.StringVar(&f.http, "http", "127.0.0.1:8000", "address of the API with --serve")
	return cmd
}

// testnetSummary is what `holopeer testnet --json` prints.
type testnetSummary struct {
	runSummary
	Nodes    int    `json:"nodes"`
	FormedIn string `json:"swarm_formed_in"`
	Killed   string `json:"killed,omitempty"`
}

func runTestnet(cmd *cobra.Command, f testnetFlags) error {
	if f.nodes < 2 || f.nodes > 32 {
		return fmt.Errorf("--nodes %d: use 2 to 32", f.nodes)
	}
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	say := func(format string, a ...any) {
		if !f.asJSON {
			fmt.Fprintf(out, format+"\n", a...)
		}
	}
	m, err := loadTestnetManifest(f.manifest)
	if err != nil {
		return err
	}
	if f.steps > 0 {
		m.Train.Steps = f.steps
		m.Train.Optimizer.WarmupSteps = min(m.Train.Optimizer.WarmupSteps, f.steps)
	}
	if m.Pipeline.Stages*m.Pipeline.ReplicasPerStage > f.nodes {
		return fmt.Errorf("the job needs %d stage nodes; start at least that many with --nodes", m.Pipeline.Stages*m.Pipeline.ReplicasPerStage)
	}
	dir := f.dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "holopeer-testnet-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	start := time.Now()
	var nodes []*localNode
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	lend := fmt.Sprintf("%dMiB", 512)
	for i := 0; i < f.nodes; i++ {
		boot := ""
		if i > 0 {
			boot = nodes[0].addr
		}
		n, err := startLocalNode(ctx, self, filepath.Join(dir, fmt.Sprintf("node%d", i)), fmt.Sprintf("node%d", i), f.swarm, boot,
			"--tee", "sim", "--allow-sim", "--memory", lend, "--log-level", "info", "--dashboard")
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
		say("started %s  %s", n.name, n.id)
	}
	// The researcher is a peer like any other: a node in this process.
	log, err := newLogger(cmd.ErrOrStderr(), f.logLevel)
	if err != nil {
		return err
	}
	rcfg := node.Config{
		DataDir: filepath.Join(dir, "researcher"), Swarm: f.swarm, API: "off", Logger: log, AllowSim: true,
		Listen:    []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/0")},
		Bootstrap: mustBootstrap(nodes[0].addr),
	}
	researcher, err := node.Start(ctx, rcfg)
	if err != nil {
		return err
	}
	defer researcher.Close()
	say("researcher %s joined; waiting for the swarm to elect a coordinator ...", researcher.Host().ID())
	wctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	for {
		st := researcher.Status()
		if st.Coordinator != nil && len(st.Peers) >= f.nodes && offersAll(researcher, nodes) {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the swarm did not form within %v (node logs are in %s)", f.timeout, dir)
		case <-time.After(200 * time.Millisecond):
		}
	}
	formed := time.Since(start)
	say("swarm formed in %v; dashboard: http://%s/", formed.Round(time.Millisecond), nodes[0].api)

	var killed string
	opts := runOptions{Out: filepath.Join(dir, "run"), Stdout: out, Quiet: f.asJSON}
	if f.killStageAt > 0 {
		opts.OnStep = func(p pipeline.Progress) {
			if killed != "" || p.Step != f.killStageAt || p.Plan == nil {
				return
			}
			// Prefer the stage node that is also the coordinator: its
			// death exercises both recoveries at once (a new coordinator
			// takes the job over and re-places the stage).
			victim, stage := p.Plan.Stages[len(p.Plan.Stages)/2].Replicas[0], len(p.Plan.Stages)/2
			if c := researcher.Gossip().Coordinator(); c != nil {
				if i := p.Plan.StageOf(c.PeerID.String()); i >= 0 {
					victim, stage = c.PeerID.String(), i
				}
			}
			for _, n := range nodes {
				if n.id == victim {
					killed = n.name
					say("\nkilling %s (%s, holding stage %d) after step %d", n.name, n.id, stage, p.Step)
					n.cmd.Process.Kill()
				}
			}
		}
	}
	sum, err := runJob(ctx, researcher, m, opts)
	if err != nil {
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(testnetSummary{runSummary: sum, Nodes: f.nodes, FormedIn: formed.Round(time.Millisecond).String(), Killed: killed})
	}
	if lb := researcher.Leaderboard(); len(lb) > 0 {
		say("\ncontribution ledger (receipts signed by the coordinator):")
		for _, e := range lb {
			say("  %s  %8.2f points  %6.1f compute-s  %s tokens", e.PeerID, e.Points, e.ComputeS, si(float64(e.Tokens)))
		}
	}
	if f.serve {
		say("\nserving the trained model from the swarm ...")
		return serveTrained(ctx, researcher, m, sum.Checkpoint, serveOptions{HTTP: f.http, Stdout: out, Logger: researcher.Logger(),
			Ready: func(base string) {
				say("OpenAI-compatible API on %s (Ctrl-C stops it); try:", base)
				say(`  curl -N %s/v1/completions -H 'Content-Type: application/json' -d '{"prompt": "the ", "max_tokens": 24, "temperature": 0, "stream": true}'`, base)
			}})
	}
	if f.keep {
		say("swarm running; try: holopeer status --api %s   (Ctrl-C stops it)", nodes[0].api)
		<-ctx.Done()
	}
	return nil
}

// offersAll reports whether the researcher has every compute node's
// capability record, i.e. the coordinator can see them on offer.
func offersAll(n *node.Node, nodes []*localNode) bool {
	present := n.Gossip().Presence()
	for _, ln := range nodes {
		if ln.done != nil {
			select {
			case <-ln.done:
				continue
			default:
			}
		}
		found := false
		for id := range present {
			if id.String() == ln.id {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func loadTestnetManifest(path string) (*manifest.Manifest, error) {
	if path != "" {
		return manifest.Load(path)
	}
	b, err := testnet.Manifests.ReadFile(testnet.Demo)
	if err != nil {
		return nil, err
	}
	m, err := manifest.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("embedded %s: %w", testnet.Demo, err)
	}
	return m, nil
}

func mustBootstrap(addr string) []lpeer.AddrInfo {
	infos, err := hpeer.ParseBootstrap([]string{addr})
	if err != nil {
		return nil
	}
	return infos
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
