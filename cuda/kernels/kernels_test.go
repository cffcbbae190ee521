package kernels

import (
	"regexp"
	"strings"
	"testing"
)

// Every kernel the Go side launches is defined in its source as an
// extern "C" __global__ function and is an entry of the committed PTX, and
// nothing else is: a renamed or forgotten kernel fails here, in every
// build, before any GPU sees it.
func TestEntryPointsMatchSources(t *testing.T) {
	defRE := regexp.MustCompile(`extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\(`)
	entryRE := regexp.MustCompile(`(?m)^\.visible \.entry (\w+)\(`)
	for _, m := range Modules() {
		defined := names(defRE, m.Source)
		entries := names(entryRE, m.PTX)
		want := strings.Join(m.Kernels, " ")
		if got := strings.Join(defined, " "); got != want {
			t.Errorf("%s.cu defines [%s], the Go side launches [%s]", m.Name, got, want)
		}
		if got := strings.Join(entries, " "); got != want {
			t.Errorf("ptx/%s.ptx has entries [%s], want [%s] (regenerate: go test -tags cuda ./cuda/kernels -update)", m.Name, got, want)
		}
		if Release(m.PTX) == "" {
			t.Errorf("ptx/%s.ptx does not say which NVRTC release made it", m.Name)
		}
	}
}

func names(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}
