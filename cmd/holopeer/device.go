package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/stage/tensor"
	_ "github.com/holopeer/holopeer/stage/tensor/cpu" // always there to fall back to
)

// Devices --device accepts. The GPU backends are linked only into binaries
// built with their tag (device_cuda.go, device_metal.go): the default
// binary has no cgo.
var deviceNames = []string{"auto", "cpu", "cuda", "metal"}

// deviceTags says how to get a backend this binary lacks.
var deviceTags = map[string]string{
	"cuda":  "build holopeer with -tags cuda on a machine with the CUDA toolkit",
	"metal": "build holopeer with -tags metal on a Mac",
}

// describer is a backend that can name its device (cuda, metal).
type describer interface{ Device() string }

func describe(be tensor.Backend) string {
	if d, ok := be.(describer); ok {
		return be.Name() + " (" + d.Device() + ")"
	}
	if be.Name() == "cpu" {
		return fmt.Sprintf("cpu (%d threads)", runtime.GOMAXPROCS(0))
	}
	return be.Name()
}

// openDevice opens the backend --device names and says in one line what
// runs and why. A GPU that is asked for (or, for auto, present in the
// binary) but cannot be opened — no device, no driver, not compiled in —
// is not fatal: the node falls back to cpu and the message says so. Only
// a name that is no device at all is an error.
func openDevice(name string) (tensor.Backend, string, error) {
	if !slices.Contains(deviceNames, name) {
		return nil, "", fmt.Errorf("--device %q: want one of %s", name, strings.Join(deviceNames, ", "))
	}
	var tried []string
	try := func(n string) tensor.Backend {
		be, err := tensor.Open(n)
		switch {
		case err == nil:
			return be
		case errors.Is(err, tensor.ErrUnknownBackend):
			tried = append(tried, fmt.Sprintf("%s is not built into this binary (%s)", n, deviceTags[n]))
		default:
			tried = append(tried, fmt.Sprintf("%s unavailable: %s", n, strings.TrimPrefix(err.Error(), fmt.Sprintf("tensor: open backend %q: ", n))))
		}
		return nil
	}
	switch name {
	case "cpu":
	case "auto":
		for _, n := range tensor.Backends() {
			if n == "cpu" {
				continue
			}
			if be := try(n); be != nil {
				return be, "device auto → " + describe(be), nil
			}
		}
	default:
		if be := try(name); be != nil {
			return be, "device " + name + " → " + describe(be), nil
		}
	}
	be, err := tensor.Open("cpu")
	if err != nil {
		return nil, "", err
	}
	msg := "device " + name + " → " + describe(be)
	switch {
	case len(tried) > 0:
		msg += "; " + strings.Join(tried, "; ")
	case name == "auto":
		msg += "; this binary has no GPU backend (build with -tags cuda or -tags metal)"
	}
	return be, msg, nil
}

// gemmSize is the square GEMM that measureGFLOPS times: big enough that a
// GPU is not timing its launch overhead, small enough to take well under a
// second on a laptop's cores.
func gemmSize(be tensor.Backend, quick bool) int {
	switch {
	case quick:
		return 256
	case be.Name() == "cpu":
		return 1024
	}
	return 2048
}

// measureGFLOPS times n×n×n float32 GEMMs on be for at least minTime (and
// at least three) and returns the throughput in GFLOP/s: the figure a
// node's capability record offers and the placement planner divides
// layers by. Device work is asynchronous, so the clock stops after Sync.
func measureGFLOPS(ctx context.Context, be tensor.Backend, n int, minTime time.Duration) (float64, error) {
	a, b, c := be.Alloc(tensor.Float32, n*n), be.Alloc(tensor.Float32, n*n), be.Alloc(tensor.Float32, n*n)
	defer func() {
		be.Free(a)
		be.Free(b)
		be.Free(c)
	}()
	be.Fill(a, 0.5)
	be.Fill(b, -0.25)
	be.Gemm(false, false, n, n, n, 1, a, b, 0, c) // warm-up: pools, kernels, clocks
	if err := be.Sync(); err != nil {
		return 0, fmt.Errorf("measuring %s: %w", be.Name(), err)
	}
	start := time.Now()
	runs := 0
	for runs < 3 || time.Since(start) < minTime {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		be.Gemm(false, false, n, n, n, 1, a, b, 0, c)
		runs++
		if runs%8 == 0 { // keep the device's queue short and the clock honest
			if err := be.Sync(); err != nil {
				return 0, fmt.Errorf("measuring %s: %w", be.Name(), err)
			}
		}
	}
	if err := be.Sync(); err != nil {
		return 0, fmt.Errorf("measuring %s: %w", be.Name(), err)
	}
	flop := 2 * float64(n) * float64(n) * float64(n) * float64(runs)
	return flop / time.Since(start).Seconds() / 1e9, nil
}

func init() { register(newDeviceCmd) }

func newDeviceCmd() *cobra.Command {
	var (
		name    string
		minTime time.Duration
	)
	cmd := &cobra.Command{
		Use:   "device",
		Short: "Say which compute backend this machine would run stages on, and how fast",
		Long: `device opens the backend --device picks, exactly as 'holopeer up --device'
does, prints which one runs (or why a GPU was passed over), and times a
float32 GEMM on it: the GFLOP/s figure a node offers the swarm.

GPU backends are in the binary only when it was built with their tag:
  go build -tags cuda ./cmd/holopeer    (NVIDIA; needs the CUDA toolkit)
  go build -tags metal ./cmd/holopeer   (Apple silicon; on a Mac)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "backends   %s (built into this binary)\n", strings.Join(tensor.Backends(), ", "))
			be, msg, err := openDevice(name)
			if err != nil {
				return err
			}
			fmt.Fprintln(w, msg)
			n := gemmSize(be, false)
			gf, err := measureGFLOPS(cmd.Context(), be, n, minTime)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "gemm       %.1f GFLOP/s (%d³ float32 on %s)\n", gf, n, be.Name())
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "device", "auto", "compute backend: "+strings.Join(deviceNames, ", "))
	cmd.Flags().DurationVar(&minTime, "time", 500*time.Millisecond, "minimum time to measure GEMM throughput")
	return cmd
}
