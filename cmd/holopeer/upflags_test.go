package main

import (
	"slices"
	"testing"

	ma "github.com/multiformats/go-multiaddr"
	"github.com/spf13/cobra"
)

func addrStrings(as []ma.Multiaddr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// TestNodeFlagsReplaceDefaults: on run, serve and up, a given --listen or
// --api replaces the default rather than adding to it, and --port-base
// alone works (it used to fail as if --listen had been given, because the
// researcher's defaults were put in with Set).
func TestNodeFlagsReplaceDefaults(t *testing.T) {
	cmds := map[string]func() *cobra.Command{"run": newRunCmd, "serve": newServeCmd, "up": newUpCmd}
	for name, mk := range cmds {
		parse := func(args ...string) *upFlags {
			t.Helper()
			cmd := mk()
			if err := cmd.ParseFlags(args); err != nil {
				t.Fatalf("%s %v: %v", name, args, err)
			}
			// Each command keeps its upFlags somewhere of its own: find
			// them through the flag set they registered on.
			f := &upFlags{flags: cmd.Flags()}
			f.listen, _ = cmd.Flags().GetStringSlice("listen")
			f.api, _ = cmd.Flags().GetString("api")
			f.portBase, _ = cmd.Flags().GetInt("port-base")
			return f
		}
		f := parse("--port-base", "7700")
		listen, apiAddr, err := f.addrs()
		if err != nil {
			t.Fatalf("%s --port-base 7700: %v", name, err)
		}
		want := []string{"/ip4/0.0.0.0/tcp/7700", "/ip4/0.0.0.0/udp/7700/quic-v1"}
		if got := addrStrings(listen); !slices.Equal(got, want) {
			t.Errorf("%s --port-base 7700 listens on %v, want %v", name, got, want)
		}
		if apiAddr != "127.0.0.1:7701" {
			t.Errorf("%s --port-base 7700: api %q, want 127.0.0.1:7701", name, apiAddr)
		}

		f = parse("--listen", "/ip4/127.0.0.1/tcp/7800", "--api", "127.0.0.1:7900")
		listen, apiAddr, err = f.addrs()
		if err != nil {
			t.Fatal(err)
		}
		if got := addrStrings(listen); !slices.Equal(got, []string{"/ip4/127.0.0.1/tcp/7800"}) {
			t.Errorf("%s --listen /ip4/127.0.0.1/tcp/7800 listens on %v: the default must be replaced", name, got)
		}
		if apiAddr != "127.0.0.1:7900" {
			t.Errorf("%s --api 127.0.0.1:7900: api %q", name, apiAddr)
		}

		f = parse("--port-base", "7700", "--listen", "/ip4/127.0.0.1/tcp/7800")
		if _, _, err := f.addrs(); err == nil {
			t.Errorf("%s: --port-base with --listen accepted", name)
		}
		f = parse("--port-base", "7700", "--api", "off")
		if _, apiAddr, err := f.addrs(); err != nil || apiAddr != "off" {
			t.Errorf("%s --port-base 7700 --api off: api %q, %v", name, apiAddr, err)
		}
	}
	// The researcher's defaults: ephemeral ports and no API.
	cmd := newRunCmd()
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if l, _ := cmd.Flags().GetStringSlice("listen"); !slices.Equal(l, []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"}) {
		t.Errorf("run listens on %v by default", l)
	}
	if a, _ := cmd.Flags().GetString("api"); a != "off" {
		t.Errorf("run serves the API on %q by default", a)
	}
	if cmd.Flags().Changed("listen") || cmd.Flags().Changed("api") || cmd.Flags().Changed("data-dir") {
		t.Error("run's defaults count as given flags")
	}
}
