package pipeline

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// writeFrame writes a uvarint length then b.
func writeFrame(w io.Writer, b []byte) error {
	var hdr [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(hdr[:], uint64(len(b)))
	if _, err := w.Write(hdr[:k]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// readFrame reads one uvarint-length-prefixed frame, refusing lengths over
// max before allocating.
func readFrame(r io.Reader, max int) ([]byte, error) {
	br := bufio.NewReaderSize(r, 16)
	l, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, fmt.Errorf("read length: %w", err)
	}
	if l > uint64(max) {
		return nil, fmt.Errorf("frame of %d bytes exceeds limit %d", l, max)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, fmt.Errorf("read frame: %w", err)
	}
	return b, nil
}
