package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/ledger"
)

func init() { register(newLedgerCmd) }

// ledgerFlags choose where the receipts and the term history come from.
type ledgerFlags struct {
	dataDir string
	api     string
	swarm   string
	asJSON  bool
	max     int
	cmd     *cobra.Command
}

func (f *ledgerFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "read the ledger a node keeps in this data dir (works offline, also while the node runs)")
	fl.StringVar(&f.api, "api", "", "read the receipts and terms from a running node's control API at HOST:PORT instead, and verify them here")
	fl.StringVar(&f.swarm, "swarm", "", "the swarm whose receipts count (default: the swarm of the term history)")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON (the field names are stable; the set of fields may grow)")
	fl.IntVar(&f.max, "max-receipts", ledger.DefaultMaxReceipts, "refuse to read more receipts than this")
	f.cmd = cmd
}

// load reads receipts and history and verifies them here: nothing is taken
// on the node's word.
func (f *ledgerFlags) load(cmd *cobra.Command) (ledger.Report, error) {
	if f.cmd.Flags().Changed("api") && f.cmd.Flags().Changed("data-dir") {
		return ledger.Report{}, errors.New("give --data-dir or --api, not both")
	}
	var (
		receipts []ledger.Receipt
		hist     *ledger.History
		err      error
	)
	if f.api != "" {
		receipts, hist, err = ledger.Fetch(cmd.Context(), f.api, f.swarm, f.max)
		if err != nil {
			return ledger.Report{}, err
		}
	} else {
		dir := ledger.Dir(f.dataDir)
		hist, err = ledger.LoadHistory(filepath.Join(dir, ledger.TermsFile), f.swarm)
		if err != nil {
			return ledger.Report{}, fmt.Errorf("%w (is %s the data dir of a node that has followed a coordinator?)", err, f.dataDir)
		}
		var skipped int
		receipts, skipped, err = ledger.LoadReceipts(filepath.Join(dir, ledger.ReceiptsFile), f.max)
		if err != nil {
			return ledger.Report{}, err
		}
		if skipped > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: %d lines of %s are not receipts and were skipped\n", skipped, filepath.Join(dir, ledger.ReceiptsFile))
		}
	}
	swarm := f.swarm
	if swarm == "" {
		swarm = hist.Swarm()
	}
	if swarm == "" {
		return ledger.Report{}, errors.New("the term history is empty, so no receipt can be checked; give --swarm, or wait until the node has followed a coordinator")
	}
	return ledger.Verify(swarm, receipts, hist), nil
}

// errRejected makes `ledger verify` exit 3 when it rejected receipts, so
// scripts can tell "some receipts are bad" from "could not read".
type errRejected struct{ n, of int }

func (e errRejected) Error() string {
	return fmt.Sprintf("%d of %d receipts rejected", e.n, e.of)
}
func (e errRejected) ExitCode() int { return 3 }

func newLedgerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Check contribution receipts and show who contributed most",
		Long: `The contribution ledger credits each peer for the time its machine was on offer,
the minutes it computed for jobs and the tokens it processed. At each
checkpoint interval the coordinator signs a receipt for each node; receipts
are gossiped and every node keeps them, with the coordinators its election
accepted, in <data-dir>/ledger/.

Points = hours on offer + compute minutes + tokens / 10,000.

The subcommands recompute every total from the receipts themselves: a
receipt counts only if its signature holds, it belongs to the swarm, its
signer was the coordinator of its term, and it credits no steps or time
already credited.`,
	}
	cmd.AddCommand(newLedgerVerifyCmd(), newLedgerTopCmd())
	return cmd
}

func newLedgerVerifyCmd() *cobra.Command {
	var (
		f    ledgerFlags
		peer string
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Verify every receipt and print each peer's total and each rejected receipt",
		Long: `verify checks every receipt a node keeps (--data-dir, offline) or serves
(--api) and prints each peer's verified total and every receipt it rejected,
with the reason: a bad signature (a forged or tampered receipt), a signer
that was not coordinator in that term, a term not in the history, another
swarm, a duplicate, or credit for steps or time already credited.

Exit status: 0 when every receipt holds, 3 when some were rejected, 1 when
the ledger could not be read.`,
		Example: `  holopeer ledger verify --data-dir ~/.holopeer
  holopeer ledger verify --api 127.0.0.1:7601 --peer 12D3KooW… --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := f.load(cmd)
			if err != nil {
				return err
			}
			if peer != "" {
				rep = onlyPeer(rep, peer)
			}
			w := cmd.OutOrStdout()
			if f.asJSON {
				if err := writeJSON(w, rep); err != nil {
					return err
				}
			} else {
				printVerify(w, rep)
			}
			if n := len(rep.Rejected); n > 0 {
				return errRejected{n, rep.Receipts}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&peer, "peer", "", "show only this peer's total and rejected receipts")
	return cmd
}

func newLedgerTopCmd() *cobra.Command {
	var (
		f ledgerFlags
		n int
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "List the peers with the most verified points",
		Example: `  holopeer ledger top --data-dir ~/.holopeer
  holopeer ledger top --api 127.0.0.1:7601 -n 5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := f.load(cmd)
			if err != nil {
				return err
			}
			top := rep.Top(n)
			w := cmd.OutOrStdout()
			if f.asJSON {
				return writeJSON(w, top)
			}
			if len(top) == 0 {
				fmt.Fprintf(w, "no verified receipts in swarm %s yet\n", rep.Swarm)
			} else {
				printTotals(w, top)
			}
			if k := len(rep.Rejected); k > 0 {
				fmt.Fprintf(w, "\n%d receipts rejected; see `holopeer ledger verify`\n", k)
			}
			printInsecure(w, rep)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntVarP(&n, "top", "n", 20, "how many peers to list (0 for all)")
	return cmd
}

func onlyPeer(rep ledger.Report, peer string) ledger.Report {
	var totals []api.LedgerEntry
	for _, e := range rep.Totals {
		if e.PeerID == peer {
			totals = append(totals, e)
		}
	}
	var rejected []ledger.Rejection
	for _, r := range rep.Rejected {
		if r.Peer == peer {
			rejected = append(rejected, r)
		}
	}
	rep.Totals, rep.Rejected = totals, rejected
	if rep.Totals == nil {
		rep.Totals = []api.LedgerEntry{}
	}
	if rep.Rejected == nil {
		rep.Rejected = []ledger.Rejection{}
	}
	return rep
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printVerify(w io.Writer, rep ledger.Report) {
	fmt.Fprintf(w, "swarm %s: %d receipts, %d accepted, %d rejected\n", rep.Swarm, rep.Receipts, rep.Accepted, len(rep.Rejected))
	printInsecure(w, rep)
	if len(rep.Totals) > 0 {
		fmt.Fprintln(w)
		printTotals(w, rep.Totals)
	}
	if len(rep.Rejected) > 0 {
		fmt.Fprintf(w, "\nrejected:\n")
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RECEIPT\tPEER\tTERM\tSIGNER\tREASON")
		for _, r := range rep.Rejected {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Hash.Short(), r.Peer, r.Term, r.Coordinator, oneLine(r.Err.Error()))
		}
		tw.Flush()
	}
}

func printTotals(w io.Writer, totals []api.LedgerEntry) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tPEER\tPOINTS\tON OFFER\tCOMPUTE\tTOKENS\tRECEIPTS\t")
	for i, e := range totals {
		fmt.Fprintf(tw, "%d\t%s\t%.3f\t%s\t%s\t%s\t%d\t\n", i+1, e.PeerID, e.Points,
			seconds(e.PresenceS), seconds(e.ComputeS), humanize.Comma(e.Tokens), e.Receipts)
	}
	tw.Flush()
}

func printInsecure(w io.Writer, rep ledger.Report) {
	if len(rep.InsecureTerms) == 0 {
		return
	}
	terms := make([]string, len(rep.InsecureTerms))
	for i, t := range rep.InsecureTerms {
		terms[i] = fmt.Sprint(t)
	}
	if len(terms) == 1 {
		fmt.Fprintf(w, "INSECURE: term %s was coordinated under sim attestation; its credit is for testnets only\n", terms[0])
		return
	}
	fmt.Fprintf(w, "INSECURE: terms %s were coordinated under sim attestation; their credit is for testnets only\n", strings.Join(terms, ", "))
}

func seconds(s float64) string {
	switch {
	case s < 120:
		return fmt.Sprintf("%.0fs", s)
	case s < 7200:
		return fmt.Sprintf("%.1fm", s/60)
	}
	return fmt.Sprintf("%.1fh", s/3600)
}
