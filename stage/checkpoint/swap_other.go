//go:build !linux

package checkpoint

import "errors"

// exchange is not available here; swapIn falls back to two renames.
func exchange(a, b string) error {
	return errors.New("checkpoint: no atomic exchange on this platform")
}
