package core

import (
	"errors"
	"fmt"
)

// Safely runs f, turning a panic into an ErrMalformed error. Report parsers
// and verifiers from the attestation libraries see bytes from untrusted
// peers; a parser bug there must cost one rejected message, not the process.
func Safely(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s panicked on hostile input: %v", ErrMalformed, what, r)
		}
	}()
	return f()
}

// Malformed wraps err as ErrMalformed unless it already is.
func Malformed(what string, err error) error {
	if errors.Is(err, ErrMalformed) {
		return err
	}
	return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
}
