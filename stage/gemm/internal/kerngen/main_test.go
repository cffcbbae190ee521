package main

import (
	"bytes"
	"os"
	"testing"
)

// TestGeneratedFileIsCurrent fails when kernels_amd64.s was edited by hand
// or the generator changed without `go generate ./stage/gemm`.
func TestGeneratedFileIsCurrent(t *testing.T) {
	have, err := os.ReadFile("../../kernels_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, generate()) {
		t.Fatal("kernels_amd64.s differs from kerngen's output: run go generate ./stage/gemm")
	}
}
