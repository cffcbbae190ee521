// Command holopeer is the one binary of a holopeer swarm: it runs a node,
// submits and serves jobs, starts local testnets and measures itself.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	hpeer "github.com/holopeer/holopeer/peer"
)

// Stdout and Stderr are package variables so tests can capture output.
var (
	Stdout io.Writer = os.Stdout
	Stderr io.Writer = os.Stderr
)

// version is set at link time (-ldflags "-X main.version=…").
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "holopeer",
		Short:         "Pool idle machines into a peer-to-peer swarm that trains and serves transformers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(Stdout)
	root.SetErr(Stderr)
	for _, mk := range subcommands {
		root.AddCommand(mk())
	}
	return root
}

// subcommands holds the constructors of every subcommand; each lives in its
// own file and registers itself from init.
var subcommands []func() *cobra.Command

func register(mk func() *cobra.Command) { subcommands = append(subcommands, mk) }

func main() {
	hpeer.Version = version
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		// One clear line, no stack trace: the error text says what is wrong
		// and, where there is one, what to do.
		fmt.Fprintln(Stderr, "holopeer:", oneLine(err.Error()))
		var ec exitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

// exitCoder lets a command choose its exit status.
type exitCoder interface{ ExitCode() int }

// oneLine folds a multi-line error (libp2p lists every failed dial on its
// own line) into one line for the terminal.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
