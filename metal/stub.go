//go:build !(darwin && cgo && metal)

package metal

import (
	"fmt"
	"runtime"

	"github.com/holopeer/holopeer/stage/tensor"
)

func init() {
	tensor.Register("metal", Priority, func() (tensor.Backend, error) { return nil, unavailable() })
}

// Available reports whether this binary can use Metal: never, here.
func Available() bool { return false }

func unavailable() error {
	if runtime.GOOS != "darwin" {
		return fmt.Errorf("%w: Metal needs macOS, this is %s/%s", ErrUnavailable, runtime.GOOS, runtime.GOARCH)
	}
	return fmt.Errorf("%w: this binary was built without cgo or the metal tag (go build -tags metal)", ErrUnavailable)
}
