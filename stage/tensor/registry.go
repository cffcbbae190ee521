package tensor

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// OpenFunc opens a backend. It returns an error (never exits or panics)
// when the device or its driver is missing, so that "auto" can fall back.
type OpenFunc func() (Backend, error)

type registration struct {
	name     string
	priority int
	open     OpenFunc
}

var (
	registryMu sync.Mutex
	registry   = map[string]registration{}
)

// ErrUnknownBackend is returned by Open for a name nobody registered.
var ErrUnknownBackend = errors.New("tensor: unknown backend")

// Register makes a backend available to Open under name. Higher priority
// wins when Open is asked for "auto" (cpu registers 0, GPUs more). It
// panics when name is registered twice or is "auto".
func Register(name string, priority int, open OpenFunc) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if name == "" || name == "auto" {
		panic(fmt.Sprintf("tensor: cannot register a backend named %q", name))
	}
	if _, dup := registry[name]; dup {
		panic(fmt.Sprintf("tensor: backend %q registered twice", name))
	}
	registry[name] = registration{name: name, priority: priority, open: open}
}

// Backends lists the registered names, best first.
func Backends() []string {
	regs := sortedRegistrations()
	names := make([]string, len(regs))
	for i, r := range regs {
		names[i] = r.name
	}
	return names
}

// Open opens the backend registered under name. "auto" tries every
// registered backend from the highest priority down and returns the first
// that opens; the errors of those that failed are joined into the error
// when none opens.
func Open(name string) (Backend, error) {
	if name != "auto" {
		registryMu.Lock()
		r, ok := registry[name]
		registryMu.Unlock()
		if !ok {
			return nil, fmt.Errorf("%w %q (registered: %v)", ErrUnknownBackend, name, Backends())
		}
		be, err := r.open()
		if err != nil {
			return nil, fmt.Errorf("tensor: open backend %q: %w", name, err)
		}
		return be, nil
	}
	var errs []error
	for _, r := range sortedRegistrations() {
		be, err := r.open()
		if err == nil {
			return be, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%w: none registered (import stage/tensor/cpu)", ErrUnknownBackend)
	}
	return nil, fmt.Errorf("tensor: no backend opened: %w", errors.Join(errs...))
}

func sortedRegistrations() []registration {
	registryMu.Lock()
	defer registryMu.Unlock()
	regs := make([]registration, 0, len(registry))
	for _, r := range registry {
		regs = append(regs, r)
	}
	slices.SortFunc(regs, func(a, b registration) int {
		if c := cmp.Compare(b.priority, a.priority); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return regs
}
