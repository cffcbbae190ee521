package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/peer/api"
)

func init() { register(newProbeCmd) }

func newProbeCmd() *cobra.Command {
	var (
		addr       string
		dataDir    string
		peerID     string
		size       string
		directOnly bool
		timeout    time.Duration
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Send a payload from a running node to a peer and report the path it took",
		Long: `probe asks a running node (through its control API) to send a random payload
to a peer over the /holopeer/probe/1.0.0 protocol. The peer hashes what it
receives and answers with the hash, so probe reports whether the payload
arrived intact, how fast, and whether it crossed a direct (possibly
hole-punched) connection or a relay: "can my node reach that peer directly?".

Relays cap what one connection may carry (32 MiB each way by default), so a
large probe over a relay fails by design; --direct-only never uses a relay and
waits up to --timeout for a direct connection.

A probe changes what the node does, so the control API asks for the node's
token: probe reads it from api.token in the node's --data-dir (readable only
by the user the node runs as).`,
		Example: `  holopeer probe --peer 12D3KooW… --bytes 16MiB
  holopeer probe --api 127.0.0.1:7611 --data-dir ~/.holopeer-2 --peer 12D3KooW… --direct-only --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if peerID == "" {
				return fmt.Errorf("--peer is required: the peer id to probe (see 'holopeer status')")
			}
			n, err := humanize.ParseBytes(size)
			if err != nil || n == 0 {
				return fmt.Errorf("--bytes %q: use a size such as 16MiB", size)
			}
			token, err := api.ReadToken(dataDir)
			if err != nil {
				return fmt.Errorf("probe needs the node's API token: %w", err)
			}
			req := api.ProbeRequest{Peer: peerID, Bytes: int64(n), DirectOnly: directOnly, Timeout: timeout.String()}
			res, err := api.Client{Addr: addr, Token: token}.Probe(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s intact over a %s connection (%s) in %s, %.1f MiB/s\nsha256 %s\n",
				res.Peer, humanize.IBytes(uint64(res.Bytes)), res.Conn, res.RemoteAddr, res.Elapsed, res.MiBps, res.SHA256)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "api", api.DefaultAddr, "HOST:PORT of the node's control API")
	fl.StringVar(&dataDir, "data-dir", defaultDataDir(), "the node's data dir, where its API token is")
	fl.StringVar(&peerID, "peer", "", "peer id to probe")
	fl.StringVar(&size, "bytes", "16MiB", "payload size")
	fl.BoolVar(&directOnly, "direct-only", false, "never cross a relay; wait for a direct connection")
	fl.DurationVar(&timeout, "timeout", 2*time.Minute, "give up after this long")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
