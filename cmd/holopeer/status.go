package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/peer/api"
)

func init() { register(newStatusCmd) }

func newStatusCmd() *cobra.Command {
	var (
		addr   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a running node's view of itself and the swarm",
		Long: `status reads the control API of a running node (holopeer up) and prints its
peer id, addresses, reachability, the swarm members it is connected to (direct
or relayed) and the coordinator it follows. --json prints the API's JSON; the
field names are stable but the set of fields may grow.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := api.Client{Addr: addr}.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "api", api.DefaultAddr, "HOST:PORT of the node's control API")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(w io.Writer, st api.Status) {
	fmt.Fprintf(w, "peer         %s\n", st.PeerID)
	fmt.Fprintf(w, "swarm        %s\n", st.Swarm)
	fmt.Fprintf(w, "reachability %s\n", st.Reachability)
	fmt.Fprintf(w, "backend      %s   tee %s\n", st.Backend, st.TEE)
	if c := st.Coordinator; c != nil {
		insecure := ""
		if c.Insecure {
			insecure = "  INSECURE (sim TEE: testnets only)"
		}
		fmt.Fprintf(w, "coordinator  %s term %d tee %s lease until %s%s\n", c.PeerID, c.Term, c.TEE, c.LeaseExpires.Format("15:04:05"), insecure)
	} else {
		fmt.Fprintf(w, "coordinator  none\n")
	}
	for _, a := range st.Addrs {
		fmt.Fprintf(w, "address      %s\n", a)
	}
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "warning      %s\n", warn)
	}
	fmt.Fprintf(w, "\n%d peers\n", len(st.Peers))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tCONN\tBACKEND\tGFLOPS\tTEE\tADDR")
	for _, p := range st.Peers {
		addr := ""
		if len(p.Addrs) > 0 {
			addr = p.Addrs[0]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s\t%s\n", p.PeerID, p.Conn, p.Backend, p.GFLOPS, p.TEE, addr)
	}
	tw.Flush()
}
