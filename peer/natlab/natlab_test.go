package natlab

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// The lab test runs real `holopeer up` processes behind real NAT routers.
// It needs root; elsewhere it is skipped with the reason.

var (
	binDir    string // holds binPath; removed at exit
	binPath   string // holopeer, built once when the lab can run
	labReason error  // why the lab cannot run here (nil when it can)
)

func TestMain(m *testing.M) {
	flag.Parse()
	labReason = Check("")
	if labReason == nil && !testing.Short() {
		dir, err := os.MkdirTemp("", "holopeer-natlab-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		binDir, binPath = dir, filepath.Join(dir, "holopeer")
		if out, err := exec.Command("go", "build", "-o", binPath, "github.com/holopeer/holopeer/cmd/holopeer").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build holopeer: %v\n%s", err, out)
			os.Exit(1)
		}
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

const (
	portBase = 4001
	apiAddr  = "127.0.0.1:4002" // port base + 1
	swarm    = "natlab"
	payload  = 16 << 20
)

// node is a holopeer process in the lab.
type node struct {
	name string
	ns   string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	err  bytes.Buffer
	done chan struct{}
	id   string
	dir  string // data dir: probe reads the API token there
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

func (n *node) stdout() string { n.mu.Lock(); defer n.mu.Unlock(); return n.out.String() }
func (n *node) stderr() string { n.mu.Lock(); defer n.mu.Unlock(); return n.err.String() }

func (n *node) stop() {
	if n.cmd.Process == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
	}
}

var idRE = regexp.MustCompile(`peer id\s+(\S+)`)

// start runs `holopeer up` in ns and waits for its banner.
func start(t *testing.T, lab *Lab, name, ns string, args ...string) *node {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	all := append([]string{"up", "--data-dir", dir, "--swarm", swarm,
		"--port-base", fmt.Sprint(portBase), "--log-level", "debug"}, args...)
	n := &node{name: name, ns: ns, dir: dir, cmd: lab.Command(context.Background(), ns, binPath, all...), done: make(chan struct{})}
	n.cmd.Stdout = lockedWriter{&n.mu, &n.out}
	n.cmd.Stderr = lockedWriter{&n.mu, &n.err}
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.cmd.Wait(); close(n.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := idRE.FindStringSubmatch(n.stdout()); m != nil {
			n.id = m[1]
			return n
		}
		select {
		case <-n.done:
			t.Fatalf("%s exited: %s", name, n.stderr())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no banner: %s", name, n.stderr())
		}
	}
}

// addrs are the node's printed addresses on the lab's internet.
func (n *node) addrs() []string {
	var out []string
	for _, l := range strings.Split(n.stdout(), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "address" && strings.HasPrefix(f[1], "/ip4/7.7.7.") {
			out = append(out, f[1])
		}
	}
	return out
}

// holopeer runs a holopeer client command inside the node's namespace.
func (n *node) holopeer(ctx context.Context, lab *Lab, args ...string) ([]byte, error) {
	cmd := lab.Command(ctx, n.ns, binPath, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("holopeer %s in %s: %v: %s", strings.Join(args, " "), n.name, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (n *node) status(lab *Lab) (api.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st api.Status
	out, err := n.holopeer(ctx, lab, "status", "--api", apiAddr, "--json")
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(out, &st)
}

func (n *node) probe(lab *Lab, peer string) (api.ProbeResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var res api.ProbeResult
	out, err := n.holopeer(ctx, lab, "probe", "--api", apiAddr, "--data-dir", n.dir, "--peer", peer, "--bytes", fmt.Sprint(payload), "--timeout", "60s", "--json")
	if err != nil {
		return res, err
	}
	return res, json.Unmarshal(out, &res)
}

func peerOf(st api.Status, id string) *api.PeerStatus {
	for i := range st.Peers {
		if st.Peers[i].PeerID == id {
			return &st.Peers[i]
		}
	}
	return nil
}

// TestNATTraversal runs a swarm across NAT routers: pub1 is the bootstrap
// and relay, pub2 a public node that refuses to relay, home1 and home2
// sit behind easy NATs, home3 and home4 behind symmetric ones. Easy↔easy
// must end direct within 60 s and carry 16 MiB without the relay;
// easy↔symmetric and symmetric↔symmetric must end relayed, carry 16 MiB
// through the relay and say why. Private nodes must never serve the DHT;
// public ones must.
func TestNATTraversal(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the NAT lab test in -short mode (it takes about half a minute)")
	}
	if labReason != nil {
		t.Skipf("skipping the NAT lab test: %v (it runs as root, e.g. under .ci/run)", labReason)
	}
	testStart := time.Now()
	lab, err := Up(context.Background(), Config{Public: 2, Homes: []NAT{Easy, Easy, Symmetric, Symmetric}})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*node
	var nodesMu sync.Mutex
	stopAll := func() {
		nodesMu.Lock()
		defer nodesMu.Unlock()
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.stop() }()
		}
		wg.Wait()
	}
	stopSignal := lab.CloseOnInterrupt(func() { stopAll(); os.RemoveAll(binDir) })
	t.Cleanup(func() {
		stopSignal()
		stopAll()
		if t.Failed() {
			// Full logs to files (they are long at debug level), the end
			// of each in the test output.
			dir, err := os.MkdirTemp("", "holopeer-natlab-logs-")
			for _, n := range nodes {
				if err == nil {
					os.WriteFile(filepath.Join(dir, n.name+".log"), []byte(n.stderr()), 0o644)
				}
				t.Logf("---- %s (%s) stderr, last lines:\n%s", n.name, n.id, tail(n.stderr(), 40))
			}
			t.Logf("full node logs in %s", dir)
		}
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
		t.Logf("NAT lab test: %v from lab up to clean-up", time.Since(testStart).Round(100*time.Millisecond))
	})
	add := func(n *node) *node { nodesMu.Lock(); nodes = append(nodes, n); nodesMu.Unlock(); return n }
	t.Logf("lab %s up in %v", lab.Prefix, time.Since(testStart).Round(time.Millisecond))

	pub1 := add(start(t, lab, "pub1", lab.Public[0].NS))
	boot := strings.Join(pub1.addrs(), ",")
	if boot == "" {
		t.Fatalf("pub1 printed no address on the lab internet:\n%s", pub1.stdout())
	}
	pub2 := add(start(t, lab, "pub2", lab.Public[1].NS, "--bootstrap", boot, "--relay=false"))
	homesStart := time.Now()
	home1 := add(start(t, lab, "home1", lab.Homes[0].NS, "--bootstrap", boot))
	home2 := add(start(t, lab, "home2", lab.Homes[1].NS, "--bootstrap", boot))
	home3 := add(start(t, lab, "home3", lab.Homes[2].NS, "--bootstrap", boot))
	home4 := add(start(t, lab, "home4", lab.Homes[3].NS, "--bootstrap", boot))
	public, private := []*node{pub1, pub2}, []*node{home1, home2, home3, home4}
	privateIDs := []string{home1.id, home2.id, home3.id, home4.id}

	// Every status read also checks the DHT rule: public nodes serve,
	// private ones never do and never enter a server's routing table.
	statusOf := func(n *node) (api.Status, error) {
		st, err := n.status(lab)
		if err != nil {
			return st, err
		}
		isPrivate := slices.Contains(private, n)
		if isPrivate && st.DHTMode != "client" {
			t.Fatalf("%s is %s but runs DHT mode %q", n.name, st.Reachability, st.DHTMode)
		}
		if st.NAT != nil {
			for _, p := range st.NAT.DHTPeers {
				if slices.Contains(privateIDs, p) {
					t.Fatalf("private node %s is in %s's DHT routing table", p, n.name)
				}
			}
		}
		return st, nil
	}
	waitFor := func(what string, limit time.Duration, cond func() error) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			err := cond()
			if err == nil {
				return time.Since(start)
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: not within %v: %v", what, limit, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	// Easy ↔ easy: a direct connection within 60 s of the homes starting.
	waitFor("home1 and home2 connect directly", 60*time.Second-time.Since(homesStart), func() error {
		for _, pair := range [][2]*node{{home1, home2}, {home2, home1}} {
			st, err := statusOf(pair[0])
			if err != nil {
				return err
			}
			p := peerOf(st, pair[1].id)
			if p == nil || p.Conn != "direct" {
				return fmt.Errorf("%s sees %s as %+v", pair[0].name, pair[1].name, p)
			}
		}
		return nil
	})
	toDirect := time.Since(homesStart)
	t.Logf("easy↔easy direct %v after the home nodes started", toDirect.Round(time.Millisecond))

	for _, n := range public {
		st, err := statusOf(n)
		if err != nil {
			t.Fatal(err)
		}
		if st.Reachability != "public" || st.DHTMode != "server" {
			t.Errorf("%s: reachability %s (%s), DHT %s; want public, server", n.name, st.Reachability, st.NAT.ReachabilityReason, st.DHTMode)
		}
	}
	for _, n := range private {
		waitFor(n.name+" is private and holds a relay reservation", 20*time.Second, func() error {
			st, err := statusOf(n)
			if err != nil {
				return err
			}
			if st.Reachability != "private" || len(st.NAT.Relays) == 0 {
				return fmt.Errorf("reachability %s (%s), relays %v", st.Reachability, st.NAT.ReachabilityReason, st.NAT.Relays)
			}
			return nil
		})
	}
	st1, err := statusOf(pub1)
	if err != nil {
		t.Fatal(err)
	}
	if !st1.NAT.RelayService.Enabled {
		t.Fatalf("pub1 runs no relay service: %+v", st1.NAT.RelayService)
	}
	for _, id := range privateIDs {
		if p := peerOf(st1, id); p == nil || !p.Relayed || p.Reachability != "private" {
			t.Errorf("pub1 sees private node %s as %+v; want its record marked private and relayed", id, p)
		}
	}
	if st2, err := statusOf(pub2); err != nil || st2.NAT.RelayService.Enabled || !st2.NAT.RelayService.Refused {
		t.Fatalf("pub2 (--relay=false) relay service: %+v %v", st2.NAT, err)
	}

	// 16 MiB over the hole-punched path, not through the relay.
	before := st1.NAT.RelayService.BytesRelayed
	res, err := home1.probe(lab, home2.id)
	if err != nil {
		t.Fatal(err)
	}
	st1, _ = statusOf(pub1)
	relayed := st1.NAT.RelayService.BytesRelayed - before
	t.Logf("16 MiB home1→home2: %s over %s (%s), %.0f MiB/s; relay carried %d bytes meanwhile", res.Elapsed, res.Conn, res.RemoteAddr, res.MiBps, relayed)
	if res.Conn != "direct" || res.Bytes != payload || len(res.SHA256) != 64 {
		t.Fatalf("probe home1→home2: %+v", res)
	}
	if relayed >= payload/16 {
		t.Fatalf("the relay carried %d bytes during a direct 16 MiB probe", relayed)
	}

	// Easy ↔ symmetric and symmetric ↔ symmetric: relayed, with the
	// reason stated, and still carrying 16 MiB (through the relay).
	for _, c := range []struct {
		from, to *node
		because  string
	}{
		{home1, home3, "the peer's NAT is endpoint-dependent"},
		{home3, home4, "two symmetric NATs cannot be punched"},
	} {
		pair := c.from.name + "↔" + c.to.name
		var reason string
		took := waitFor(pair+" settle on a relay, saying why", 60*time.Second, func() error {
			st, err := statusOf(c.from)
			if err != nil {
				return err
			}
			p := peerOf(st, c.to.id)
			if p == nil || p.Conn != "relayed" || !strings.Contains(p.RelayReason, "hole punch failed") {
				return fmt.Errorf("%s sees %s as %+v", c.from.name, c.to.name, p)
			}
			reason = p.RelayReason
			return nil
		})
		t.Logf("%s relayed (%v more): %s", pair, took.Round(time.Millisecond), reason)
		if !strings.Contains(reason, c.because) {
			t.Errorf("%s: the reason does not say %q: %s", pair, c.because, reason)
		}
		st1, err = statusOf(pub1)
		if err != nil {
			t.Fatal(err)
		}
		before := st1.NAT.RelayService.BytesRelayed
		res, err := c.from.probe(lab, c.to.id)
		if err != nil {
			t.Fatal(err)
		}
		st1, _ = statusOf(pub1)
		relayed := st1.NAT.RelayService.BytesRelayed - before
		t.Logf("16 MiB %s: %s over %s, %.0f MiB/s; relay carried %d bytes", pair, res.Elapsed, res.Conn, res.MiBps, relayed)
		if res.Conn != "relayed" || res.Bytes != payload || len(res.SHA256) != 64 {
			t.Fatalf("probe %s: %+v", pair, res)
		}
		if relayed < payload {
			t.Fatalf("the relay carried only %d bytes of a relayed 16 MiB probe", relayed)
		}
	}
	for _, n := range []*node{home3, home4} {
		st, err := statusOf(n)
		if err != nil {
			t.Fatal(err)
		}
		if st.NAT.Mapping["udp"] != "endpoint-dependent" && st.NAT.Mapping["tcp"] != "endpoint-dependent" {
			t.Errorf("%s, behind a symmetric NAT, reports mapping %v", n.name, st.NAT.Mapping)
		}
		if !slices.ContainsFunc(st.NAT.HolePunch, func(e api.HolePunchEvent) bool { return !e.Success && e.Kind == "attempt" }) {
			t.Errorf("%s recorded no failed hole-punch attempt: %+v", n.name, st.NAT.HolePunch)
		}
	}

	// The logs tell the same story.
	for _, n := range private {
		log := n.stderr()
		if !strings.Contains(log, "reachability=private") || strings.Contains(log, `msg="DHT mode" component=nat mode=server`) {
			t.Errorf("%s's log does not show a private DHT client", n.name)
		}
	}
	if !strings.Contains(home1.stderr()+home2.stderr(), "hole punch succeeded") || !strings.Contains(home1.stderr()+home3.stderr(), "hole punch attempt failed") {
		t.Error("hole-punch outcomes missing from the logs")
	}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
