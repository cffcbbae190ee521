package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/dustin/go-humanize"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	hpeer "github.com/holopeer/holopeer/peer"
	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/node"
)

func init() { register(newUpCmd) }

// defaultDataDir is ~/.holopeer, or ./.holopeer when there is no home.
func defaultDataDir() string {
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".holopeer")
	}
	return ".holopeer"
}

// upFlags are the flags of `holopeer up`, shared with commands that run a
// node of their own (run, serve, testnet).
type upFlags struct {
	tee       string
	allowSim  bool
	teePolicy string
	dashboard bool
	device    string

	dataDir   string
	swarm     string
	listen    []string
	bootstrap []string
	api       string
	memory    string
	hours     string
	logLevel  string

	// NAT traversal.
	relay        bool
	relayAddrs   []string
	portBase     int
	announce     []string
	portMapping  bool
	reachability string

	flags *pflag.FlagSet // to tell defaults from given flags
}

// upDefaults are the defaults that differ between `up` and the commands
// that run a researcher's node.
type upDefaults struct {
	dataDir string
	listen  []string
	api     string
}

// nodeDefaults are up's: the well-known ports, the API on loopback.
func nodeDefaults() upDefaults {
	return upDefaults{
		dataDir: defaultDataDir(),
		listen:  []string{"/ip4/0.0.0.0/tcp/7600", "/ip4/0.0.0.0/udp/7600/quic-v1"},
		api:     api.DefaultAddr,
	}
}

func (f *upFlags) register(cmd *cobra.Command) { f.registerWith(cmd, nodeDefaults()) }

// registerWith registers the flags with the given defaults. The defaults
// go in at registration, never through Set: a Set marks a flag as given,
// so --port-base would see a --listen nobody typed, and a --listen typed
// would be appended to the default instead of replacing it.
func (f *upFlags) registerWith(cmd *cobra.Command, d upDefaults) {
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", d.dataDir, "directory for the node's identity key and state")
	fl.StringVar(&f.swarm, "swarm", "holopeer", "name of the swarm to join")
	fl.StringSliceVar(&f.listen, "listen", d.listen, "multiaddrs to listen on (comma-separated)")
	fl.StringSliceVar(&f.bootstrap, "bootstrap", nil, "multiaddrs (with /p2p/ID) of nodes to join through (comma-separated)")
	fl.StringVar(&f.api, "api", d.api, "HOST:PORT of the local control API (loopback unless you mean otherwise; \"off\" disables it)")
	fl.StringVar(&f.memory, "memory", "", "memory to lend to stages, e.g. 4GiB (default: half of this machine's)")
	fl.StringVar(&f.hours, "hours", "always", "when this machine is on offer, e.g. always or 18:00-08:00")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.BoolVar(&f.relay, "relay", true, "relay connections for NATed peers while this node is publicly reachable (--relay=false refuses)")
	fl.StringSliceVar(&f.relayAddrs, "relay-addr", nil, "multiaddrs (with /p2p/ID) of relays to reserve a slot on when behind NAT, besides those found in the swarm (comma-separated)")
	fl.IntVar(&f.portBase, "port-base", 0, "listen on TCP and UDP (QUIC) port N of every interface, and serve the API on 127.0.0.1:N+1 unless --api is given; for ports forwarded by hand")
	fl.StringSliceVar(&f.announce, "announce", nil, "fixed public multiaddrs to advertise besides the discovered ones, e.g. /ip4/203.0.113.7/tcp/7600 for a port forwarded by hand (comma-separated)")
	fl.BoolVar(&f.portMapping, "port-mapping", true, "ask the home router to forward a port by UPnP or NAT-PMP")
	fl.StringVar(&f.reachability, "reachability", "auto", "auto (decide from what peers observe), public or private")
	fl.StringVar(&f.tee, "tee", "none", "how this node attests to stand as coordinator: auto, snp, tdx, sim (INSECURE, testnets) or none (votes and computes, never stands)")
	fl.BoolVar(&f.allowSim, "allow-sim", false, "accept sim (INSECURE) attestation: for testnets only; every status line then says INSECURE")
	fl.StringVar(&f.device, "device", "auto", "compute backend for stages: auto, cpu, cuda or metal (a GPU that cannot open falls back to cpu, saying why)")
	fl.BoolVar(&f.dashboard, "dashboard", false, "serve the web dashboard on the --api address (fleet, coordinator, loss curves, leaderboard)")
	fl.StringVar(&f.teePolicy, "tee-policy", "", "JSON file with the TEE policy (allowed measurements, minimum TCB) a coordinator's evidence must meet")
	f.flags = fl
}

// registerResearcher registers the node flags of a command that runs a
// researcher's node (run, serve): a node of its own beside an up node on
// the same machine, with its own data dir, ephemeral ports and no control
// API unless asked.
func (f *upFlags) registerResearcher(cmd *cobra.Command) {
	f.registerWith(cmd, researcherDefaults())
}

// researcherDefaults: a data dir of its own, ephemeral ports, no API.
func researcherDefaults() upDefaults {
	return upDefaults{
		dataDir: filepath.Join(defaultDataDir(), "researcher"),
		listen:  []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"},
		api:     "off",
	}
}

// natOptions turns the NAT flags into host options.
func (f *upFlags) natOptions() ([]hpeer.Option, error) {
	relays, err := hpeer.ParseRelayAddrs(f.relayAddrs)
	if err != nil {
		return nil, fmt.Errorf("--relay-addr: %w", err)
	}
	announce, err := hpeer.ParseAnnounce(f.announce)
	if err != nil {
		return nil, fmt.Errorf("--announce: %w", err)
	}
	reach, err := hpeer.ParseReachability(f.reachability)
	if err != nil {
		return nil, fmt.Errorf("--%w", err)
	}
	opts := []hpeer.Option{
		hpeer.WithRelayService(f.relay),
		hpeer.WithPortMapping(f.portMapping),
		hpeer.WithReachability(reach),
	}
	if len(relays) > 0 {
		opts = append(opts, hpeer.WithStaticRelays(relays...))
	}
	if len(announce) > 0 {
		opts = append(opts, hpeer.WithAnnounce(announce...))
	}
	return opts, nil
}

func (f *upFlags) changed(name string) bool { return f.flags != nil && f.flags.Changed(name) }

// limitMemory sets the Go runtime's soft memory limit to what the node
// lends plus room for the node itself, so the collector works harder
// before the process grows past its share (an explicit GOMEMLIMIT wins).
func limitMemory(lend uint64) {
	if os.Getenv("GOGC") == "" {
		// A node's live heap is mostly weights in pointer-free slices,
		// which the collector does not scan, so collecting at 10% growth
		// instead of 100% costs little CPU and stops the activations each
		// token leaves behind from inflating peak RSS.
		debug.SetGCPercent(nodeGCPercent)
	}
	if lend == 0 || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(int64(lend + nodeOverhead))
}

// nodeGCPercent is the collector's GOGC on a node (an explicit GOGC wins).
const nodeGCPercent = 10

// nodeOverhead is what a node needs besides its stages: libp2p, the DHT,
// gossip and the APIs.
const nodeOverhead = 256 << 20

// addrs are the listen addresses and the API address the flags choose:
// --listen and --api replace the defaults, --port-base replaces both
// defaults but not an --api given beside it.
func (f *upFlags) addrs() (listen []ma.Multiaddr, apiAddr string, err error) {
	if listen, err = hpeer.ParseListen(f.listen); err != nil {
		return nil, "", err
	}
	apiAddr = f.api
	if f.portBase != 0 {
		if f.changed("listen") {
			return nil, "", fmt.Errorf("--port-base and --listen both choose listen addresses; give one of them")
		}
		if listen, err = hpeer.PortBaseListen(f.portBase); err != nil {
			return nil, "", fmt.Errorf("--port-base: %w", err)
		}
		if !f.changed("api") {
			apiAddr = fmt.Sprintf("127.0.0.1:%d", f.portBase+1)
		}
	}
	return listen, apiAddr, nil
}

// config turns the flags into a node config, with one clear error per bad
// flag.
func (f *upFlags) config() (node.Config, error) {
	log, err := newLogger(Stderr, f.logLevel)
	if err != nil {
		return node.Config{}, err
	}
	listen, apiAddr, err := f.addrs()
	if err != nil {
		return node.Config{}, err
	}
	natOpts, err := f.natOptions()
	if err != nil {
		return node.Config{}, err
	}
	boot, err := hpeer.ParseBootstrap(f.bootstrap)
	if err != nil {
		return node.Config{}, err
	}
	if err := hpeer.ValidateSwarmName(f.swarm); err != nil {
		return node.Config{}, fmt.Errorf("--swarm: %w", err)
	}
	mem := uint64(0)
	if f.memory != "" {
		if mem, err = humanize.ParseBytes(f.memory); err != nil {
			return node.Config{}, fmt.Errorf("--memory %q: %v; use a size such as 4GiB", f.memory, err)
		}
	} else {
		mem = totalMemory() / 2
	}
	be, msg, err := openDevice(f.device)
	if err != nil {
		return node.Config{}, fmt.Errorf("--device: %w", err)
	}
	log.Info(msg)
	// The measured throughput goes into the capability record: the
	// placement planner splits layers by it.
	gf, err := measureGFLOPS(context.Background(), be, gemmSize(be, true), 300*time.Millisecond)
	if err != nil {
		return node.Config{}, fmt.Errorf("measure %s: %w", be.Name(), err)
	}
	return node.Config{
		Backend:   be,
		DataDir:   f.dataDir,
		Swarm:     f.swarm,
		Listen:    listen,
		Bootstrap: boot,
		API:       apiAddr,
		Logger:    log,
		Offer:     hpeer.Offer{MemoryBytes: mem, Hours: f.hours, Backend: be.Name(), GFLOPS: gf},
		PeerOpts:  natOpts,
		TEE:       f.tee,
		AllowSim:  f.allowSim,
		TEEPolicy: f.teePolicy,
		Dashboard: f.dashboard,
	}, nil
}

func newUpCmd() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a node that lends this machine to a swarm, until interrupted",
		Long: `up starts a holopeer node: it loads (or creates) its identity in --data-dir,
listens on --listen, joins the swarm's private DHT through --bootstrap peers,
finds the other members of --swarm by rendezvous, and serves a control API on
--api for 'holopeer status'. It runs until SIGINT or SIGTERM.

The first node of a swarm needs no --bootstrap; it prints addresses that the
next nodes pass to --bootstrap.

Behind a home router no open port is needed: the node learns it is private
from how its peers see it, reserves a slot on a relay (a public member of the
swarm, or --relay-addr), and upgrades relayed connections to direct ones by
hole punching. 'holopeer status' says, per peer, whether the connection is
direct or relayed and why. A publicly reachable node relays for others unless
--relay=false. Operators who forward a port by hand use --port-base and
--announce.`,
		Example: `  holopeer up --swarm lab --listen /ip4/0.0.0.0/tcp/7600
  holopeer up --swarm lab --data-dir ~/.holopeer-2 --listen /ip4/0.0.0.0/tcp/7610 \
      --api 127.0.0.1:7611 --bootstrap /ip4/192.168.1.10/tcp/7600/p2p/12D3KooW…
  holopeer up --swarm lab --port-base 7600 --announce /ip4/203.0.113.7/tcp/7600 --relay=false`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config()
			if err != nil {
				return err
			}
			limitMemory(cfg.Offer.MemoryBytes)
			n, err := node.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer n.Close()
			printNodeBanner(cmd, n)
			<-cmd.Context().Done()
			fmt.Fprintln(cmd.OutOrStdout(), "shutting down")
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func printNodeBanner(cmd *cobra.Command, n *node.Node) {
	w := cmd.OutOrStdout()
	h := n.Host()
	fmt.Fprintf(w, "holopeer node up at %s\n", time.Now().Format(time.RFC3339))
	fmt.Fprintf(w, "  peer id   %s\n", h.ID())
	fmt.Fprintf(w, "  swarm     %s\n", h.Swarm())
	for _, a := range h.Addrs() {
		fmt.Fprintf(w, "  address   %s\n", a)
	}
	if a := n.APIAddr(); a != "" {
		fmt.Fprintf(w, "  api       http://%s\n", a)
		if f := cmd.Flags().Lookup("dashboard"); f != nil && f.Value.String() == "true" {
			fmt.Fprintf(w, "  dashboard http://%s/\n", a)
		}
	}
}
