package checkpoint

import (
	"errors"
	"os"
)

// swapIn makes the complete directory tmp appear at dir. A new dir is a
// plain rename. An existing one is exchanged with tmp in one atomic step
// where the platform can (Linux renameat2 RENAME_EXCHANGE), leaving the
// old checkpoint at tmp for the caller to delete; elsewhere it is moved
// aside first, which leaves a short window with no dir at all.
func swapIn(tmp, dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return os.Rename(tmp, dir)
	}
	if err := exchange(tmp, dir); err == nil {
		return nil
	}
	old := tmp + "-old"
	if err := os.Rename(dir, old); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Put the old checkpoint back rather than leave nothing.
		return errors.Join(err, os.Rename(old, dir))
	}
	return os.RemoveAll(old)
}
