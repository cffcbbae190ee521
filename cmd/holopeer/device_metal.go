//go:build metal

package main

// Linked only with -tags metal: registers the "metal" backend, real on a
// Mac built with cgo, a stub that says Metal is unavailable elsewhere.
import _ "github.com/holopeer/holopeer/metal"
