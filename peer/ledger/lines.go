package ledger

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// readLines calls fn for each newline-terminated line of r (the last line
// may lack its newline), each at most maxLine bytes, at most maxLines in
// all. A line that is too long is skipped whole without being buffered, and
// counted with the lines fn refused: a torn last line after a crash, or a
// hand-edited file, must not stop a node from starting.
func readLines(r io.Reader, maxLine, maxLines int, fn func(line []byte) error) (lines, skipped int, err error) {
	br := bufio.NewReaderSize(r, maxLine+1)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			skipped++
			if err := discardLine(br); err != nil {
				return lines, skipped, err
			}
			continue
		case errors.Is(err, io.EOF):
			if len(bytes.TrimSpace(line)) == 0 {
				return lines, skipped, nil
			}
		case err != nil:
			return lines, skipped, err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			if err != nil {
				return lines, skipped, nil
			}
			continue
		}
		if lines+skipped >= maxLines {
			return lines, skipped, fmt.Errorf("more than %d lines", maxLines)
		}
		if fn(line) != nil {
			skipped++
		} else {
			lines++
		}
		if err != nil { // EOF after a last line without newline
			return lines, skipped, nil
		}
	}
}

func discardLine(br *bufio.Reader) error {
	for {
		_, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
}
