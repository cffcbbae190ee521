//go:build cuda

package main

// Linked only with -tags cuda (cgo, the CUDA toolkit): registers the
// "cuda" backend. Without a usable GPU it reports why and --device falls
// back to cpu; the process does not exit (see package cuda).
import _ "github.com/holopeer/holopeer/cuda"
