// Package checkpointtest writes checkpoints for tests.
package checkpointtest

import (
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/model"
)

// Save captures stages (without optimizer state) and saves them as a
// checkpoint in dir, which it returns; any error fails t.
func Save(t testing.TB, dir string, stages []*model.Stage, opts ...checkpoint.SaveOption) string {
	t.Helper()
	snap, err := checkpoint.Capture(stages, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.Save(dir, snap, opts...); err != nil {
		t.Fatal(err)
	}
	return dir
}
