package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

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
	dataDir   string
	swarm     string
	listen    []string
	bootstrap []string
	api       string
	memory    string
	hours     string
	logLevel  string
}

func (f *upFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "directory for the node's identity key and state")
	fl.StringVar(&f.swarm, "swarm", "holopeer", "name of the swarm to join")
	fl.StringSliceVar(&f.listen, "listen", []string{"/ip4/0.0.0.0/tcp/7600", "/ip4/0.0.0.0/udp/7600/quic-v1"}, "multiaddrs to listen on (comma-separated)")
	fl.StringSliceVar(&f.bootstrap, "bootstrap", nil, "multiaddrs (with /p2p/ID) of nodes to join through (comma-separated)")
	fl.StringVar(&f.api, "api", api.DefaultAddr, "HOST:PORT of the local control API (loopback unless you mean otherwise; \"off\" disables it)")
	fl.StringVar(&f.memory, "memory", "", "memory to lend to stages, e.g. 4GiB (default: half of this machine's)")
	fl.StringVar(&f.hours, "hours", "always", "when this machine is on offer, e.g. always or 18:00-08:00")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
}

// config turns the flags into a node config, with one clear error per bad
// flag.
func (f *upFlags) config() (node.Config, error) {
	log, err := newLogger(Stderr, f.logLevel)
	if err != nil {
		return node.Config{}, err
	}
	listen, err := hpeer.ParseListen(f.listen)
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
	return node.Config{
		DataDir:   f.dataDir,
		Swarm:     f.swarm,
		Listen:    listen,
		Bootstrap: boot,
		API:       f.api,
		Logger:    log,
		Offer:     hpeer.Offer{MemoryBytes: mem, Hours: f.hours},
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
next nodes pass to --bootstrap.`,
		Example: `  holopeer up --swarm lab --listen /ip4/0.0.0.0/tcp/7600
  holopeer up --swarm lab --data-dir ~/.holopeer-2 --listen /ip4/0.0.0.0/tcp/7610 \
      --api 127.0.0.1:7611 --bootstrap /ip4/192.168.1.10/tcp/7600/p2p/12D3KooW…`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config()
			if err != nil {
				return err
			}
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
	}
}
