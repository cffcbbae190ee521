// Package data feeds training: token windows from a text file, and a
// synthetic corpus whose true entropy rate is known exactly, so a test can
// hold a trained model's loss against the best loss possible.
package data

import (
	"errors"
	"fmt"
)

// Source yields training windows. Each call returns batch rows of seqLen
// tokens, row-major; targets are the inputs shifted by one token, so
// targets[r*seqLen+t] is the token after inputs[r*seqLen+t].
type Source interface {
	Next(batch, seqLen int) (inputs, targets []int32, err error)
	// VocabSize bounds every id the source returns.
	VocabSize() int
}

// ErrTooShort: the corpus holds fewer than seqLen+1 tokens, so not even one
// window fits.
var ErrTooShort = errors.New("data: corpus shorter than one window")

// maxBatchTokens bounds one Next call, so a bad batch or seqLen argument
// fails instead of allocating gigabytes.
const maxBatchTokens = 1 << 28

func checkShape(batch, seqLen int) error {
	if batch < 1 || seqLen < 1 {
		return fmt.Errorf("data: batch %d and seqLen %d must be positive", batch, seqLen)
	}
	if batch > maxBatchTokens/seqLen {
		return fmt.Errorf("data: batch %d x seqLen %d exceeds %d tokens", batch, seqLen, maxBatchTokens)
	}
	return nil
}
