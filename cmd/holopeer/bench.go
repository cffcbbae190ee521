package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// benchRow is one measured figure. Every row is printed as one JSON object
// per line so that runs can be compared by machine. Baseline is the same
// quantity for the reference measured in the same process (raw TCP, gonum,
// the single-process trainer); Ratio is Value/Baseline (0 when there is no
// baseline).
type benchRow struct {
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline float64 `json:"baseline"`
	Ratio    float64 `json:"ratio"`
	Note     string  `json:"note,omitempty"`
}

func row(name string, value float64, unit string, baseline float64) benchRow {
	r := benchRow{Name: name, Value: value, Unit: unit, Baseline: baseline}
	if baseline != 0 {
		r.Ratio = value / baseline
	}
	return r
}

// benchOptions are shared by every benchmark group.
type benchOptions struct {
	Quick bool          // smaller sizes and shorter runs, for smoke tests
	Time  time.Duration // minimum measuring time per figure
}

// benchGroup measures one area (gemm, wire, training, …) and emits rows.
type benchGroup struct {
	Name string
	Run  func(ctx context.Context, o benchOptions, emit func(benchRow)) error
	// Explicit groups run only when --only names them (scale writes a
	// 2.2 GB model and starts six processes).
	Explicit bool
}

// benchGroups is filled by init functions in bench_*.go files.
var benchGroups []benchGroup

func registerBench(g benchGroup) { benchGroups = append(benchGroups, g) }

func init() { register(newBenchCmd) }

func newBenchCmd() *cobra.Command {
	var (
		only []string
		o    benchOptions
		asJS bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure this machine and holopeer's data path; prints one JSON object per figure",
		Long: `bench measures each figure against a baseline run in the same process
(gonum for GEMM, raw TCP for streams, the local trainer for the swarm) and
prints one JSON object per line:
  {"name":…, "value":…, "unit":…, "baseline":…, "ratio":…}
Groups: ` + strings.Join(benchGroupNames(), ", "),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			enc := json.NewEncoder(out)
			emit := func(r benchRow) {
				if asJS {
					_ = enc.Encode(r)
					return
				}
				if r.Baseline != 0 {
					fmt.Fprintf(out, "%-44s %12.4g %-10s baseline %12.4g  ratio %.3f\n", r.Name, r.Value, r.Unit, r.Baseline, r.Ratio)
				} else {
					fmt.Fprintf(out, "%-44s %12.4g %s\n", r.Name, r.Value, r.Unit)
				}
			}
			for _, g := range benchGroups {
				if len(only) > 0 && !slices.Contains(only, g.Name) || len(only) == 0 && g.Explicit {
					continue
				}
				if err := g.Run(cmd.Context(), o, emit); err != nil {
					return fmt.Errorf("bench %s: %w", g.Name, err)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these groups ("+strings.Join(benchGroupNames(), ",")+")")
	cmd.Flags().BoolVar(&o.Quick, "quick", false, "smaller sizes and shorter runs")
	cmd.Flags().DurationVar(&o.Time, "time", 2*time.Second, "minimum measuring time per figure")
	cmd.Flags().BoolVar(&asJS, "json", true, "print one JSON object per line (--json=false for a table)")
	return cmd
}

func benchGroupNames() []string {
	var names []string
	for _, g := range benchGroups {
		names = append(names, g.Name)
	}
	return names
}
