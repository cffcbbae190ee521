//go:build !(darwin && cgo && metal)

package metal_test

import (
	"errors"
	"testing"

	"github.com/holopeer/holopeer/metal"
	"github.com/holopeer/holopeer/stage/tensor"
	_ "github.com/holopeer/holopeer/stage/tensor/cpu"
)

// Off a Mac (or without the tag) "metal" is registered but says why it
// cannot open, and auto falls back to cpu.
func TestStubReportsUnavailable(t *testing.T) {
	if metal.Available() {
		t.Fatal("Available() on a build without Metal")
	}
	_, err := tensor.Open("metal")
	if !errors.Is(err, metal.ErrUnavailable) {
		t.Fatalf("Open(metal) = %v, want ErrUnavailable", err)
	}
	t.Log(err)
	be, err := tensor.Open("auto")
	if err != nil || be.Name() != "cpu" {
		t.Fatalf("Open(auto) = %v, %v; want cpu", be, err)
	}
}
