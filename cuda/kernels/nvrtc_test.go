//go:build cuda

package kernels

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gorgonia.org/cu/nvrtc"
)

var update = flag.Bool("update", false, "rewrite ptx/*.ptx with what this machine's NVRTC makes")

// TestKernelsCompile compiles every kernel source to PTX with NVRTC. It
// needs libnvrtc but no GPU or driver: the package imports nothing that
// initialises CUDA. A compile error, an NVRTC warning or a missing entry
// point fails it, and so does a committed PTX file that differs from what
// the same NVRTC release makes of the source (register numbers aside).
func TestKernelsCompile(t *testing.T) {
	major, minor, err := nvrtc.Version()
	if err != nil {
		t.Fatalf("nvrtc.Version: %v", err)
	}
	t.Logf("NVRTC %d.%d, options %v", major, minor, Options)
	var headers []nvrtc.Include
	for _, h := range Headers() {
		headers = append(headers, nvrtc.Include{Name: h.Name, Source: h.Source})
	}
	for _, m := range Modules() {
		t.Run(m.Name, func(t *testing.T) {
			ptx := compile(t, m, headers)
			for _, k := range m.Kernels {
				if !strings.Contains(ptx, ".entry "+k+"(") {
					t.Errorf("PTX lacks entry %s", k)
				}
			}
			t.Logf("%d bytes of PTX, %s", len(ptx), Release(ptx))
			path := filepath.Join("ptx", m.Name+".ptx")
			same := normalize(ptx) == normalize(m.PTX)
			switch {
			case *update && !same:
				if err := os.WriteFile(path, []byte(ptx), 0o644); err != nil {
					t.Fatal(err)
				}
			case same:
			case Release(ptx) != Release(m.PTX):
				t.Logf("committed %s was made by %q, this NVRTC is %q: not compared", path, Release(m.PTX), Release(ptx))
			default:
				t.Errorf("committed %s is stale: run go test -tags cuda ./cuda/kernels -update", path)
			}
		})
	}
}

// NVRTC 11.8 numbers the virtual registers of attention.cu differently
// from run to run; the instructions are the same. Comparisons ignore the
// numbers.
var regNumber = regexp.MustCompile(`(%[a-z]+)(<)?[0-9]+>?`)

func normalize(ptx string) string { return regNumber.ReplaceAllString(ptx, "$1") }

func compile(t *testing.T, m Module, headers []nvrtc.Include) string {
	t.Helper()
	prog, err := nvrtc.CreateProgram(m.Source, m.Name+".cu", headers...)
	if err != nil {
		t.Fatalf("nvrtcCreateProgram: %v", err)
	}
	defer prog.Destroy()
	cerr := prog.Compile(Options...)
	log, _ := prog.GetLog()
	log = strings.TrimRight(log, "\x00\n ")
	if cerr != nil {
		t.Fatalf("NVRTC: %v\n%s", cerr, log)
	}
	if log != "" {
		t.Errorf("NVRTC warnings:\n%s", log)
	}
	ptx, err := prog.GetPTX()
	if err != nil {
		t.Fatalf("nvrtcGetPTX: %v", err)
	}
	return strings.TrimRight(ptx, "\x00")
}
