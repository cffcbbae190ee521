package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/flynn/noise"
)

// flushSize is how much ciphertext the writer gathers before one Write:
// large writes amortise the muxer's per-write cost.
const flushSize = 1 << 20

// recordWriter seals plaintext into records (2-byte length, ciphertext) and
// writes them in batches. It is owned by whoever holds the link's send lock.
//
// Sealing and writing overlap: while one batch is being written (through
// the muxer and libp2p's own security) the next is sealed into the spare
// buffer, so a large frame keeps two cores busy. writeFrame still returns
// only after every byte was handed to w.
type recordWriter struct {
	cs          *noise.CipherState
	w           io.Writer
	buf         []byte // sealed records not yet written
	spare       []byte // the other buffer, idle or being written
	inflight    chan writeResult
	scratch     []byte       // plaintext of a frame's first record
	written     atomic.Int64 // bytes handed to w; read by Stats
	beforeWrite func() error
}

type writeResult struct {
	n   int
	err error
}

func newRecordWriter(cs *noise.CipherState, w io.Writer, beforeWrite func() error) *recordWriter {
	size := flushSize + MaxRecord + recordPrefix
	return &recordWriter{cs: cs, w: w, beforeWrite: beforeWrite,
		buf: make([]byte, 0, size), spare: make([]byte, 0, size),
		scratch: make([]byte, 0, MaxRecordPlaintext)}
}

// seal appends one record. Noise messages are limited to 65535 bytes and
// flynn/noise does not check that on Encrypt, so this does.
func (w *recordWriter) seal(pt []byte) error {
	if len(pt) > MaxRecordPlaintext {
		return fmt.Errorf("wire: record plaintext of %d bytes exceeds %d", len(pt), MaxRecordPlaintext)
	}
	n := len(w.buf)
	w.buf = binary.BigEndian.AppendUint16(w.buf, uint16(len(pt)+TagSize))
	out, err := w.cs.Encrypt(w.buf, nil, pt)
	if err != nil {
		w.buf = w.buf[:n]
		return fmt.Errorf("wire: seal: %w", err)
	}
	w.buf = out
	if len(w.buf) >= flushSize {
		return w.startWrite()
	}
	return nil
}

// wait collects the result of the write in flight, if any.
func (w *recordWriter) wait() error {
	if w.inflight == nil {
		return nil
	}
	r := <-w.inflight
	w.inflight = nil
	w.written.Add(int64(r.n))
	return r.err
}

// startWrite hands the sealed batch to a writer goroutine and swaps in the
// spare buffer, after the previous write has finished.
func (w *recordWriter) startWrite() error {
	if err := w.wait(); err != nil {
		return err
	}
	if len(w.buf) == 0 {
		return nil
	}
	if w.beforeWrite != nil {
		if err := w.beforeWrite(); err != nil {
			return err
		}
	}
	batch := w.buf
	w.buf, w.spare = w.spare[:0], batch
	done := make(chan writeResult, 1)
	w.inflight = done
	go func() {
		n, err := w.w.Write(batch)
		done <- writeResult{n, err}
	}()
	return nil
}

// flush writes everything sealed so far and waits for it.
func (w *recordWriter) flush() error {
	if err := w.startWrite(); err != nil {
		_ = w.wait()
		return err
	}
	return w.wait()
}

// writeFrame sends one frame: the header and the start of the payload in
// the first record, the rest in full records, the last one short.
func (w *recordWriter) writeFrame(h *header, payload []byte) error {
	if uint64(len(payload)) != h.Length {
		return fmt.Errorf("wire: header says %d payload bytes, have %d", h.Length, len(payload))
	}
	first := min(len(payload), firstChunk)
	pt := w.scratch[:HeaderSize+first]
	h.encode(pt)
	copy(pt[HeaderSize:], payload[:first])
	if err := w.seal(pt); err != nil {
		return err
	}
	for off := first; off < len(payload); off += MaxRecordPlaintext {
		if err := w.seal(payload[off:min(len(payload), off+MaxRecordPlaintext)]); err != nil {
			return err
		}
	}
	return w.flush()
}

// recordReader opens records. It is owned by whoever holds the link's
// receive lock.
type recordReader struct {
	cs         *noise.CipherState
	r          io.Reader
	ct         []byte       // one record's ciphertext
	first      []byte       // plaintext of a frame's first record
	read       atomic.Int64 // bytes taken from r; read by Stats
	beforeRead func(first bool) error
}

func newRecordReader(cs *noise.CipherState, r io.Reader, beforeRead func(first bool) error) *recordReader {
	return &recordReader{cs: cs, r: r, beforeRead: beforeRead,
		ct: make([]byte, MaxRecord), first: make([]byte, 0, MaxRecordPlaintext)}
}

// readRecord reads one record whose ciphertext length must be want (0: any
// length that holds at least min plaintext bytes) and decrypts it, appending
// the plaintext to dst, which must have room for it.
func (r *recordReader) readRecord(dst []byte, want, minPlain int, first bool) ([]byte, error) {
	if r.beforeRead != nil {
		if err := r.beforeRead(first); err != nil {
			return nil, err
		}
	}
	var lb [recordPrefix]byte
	n, err := io.ReadFull(r.r, lb[:])
	r.read.Add(int64(n))
	if err != nil {
		if first && errors.Is(err, io.EOF) {
			return nil, io.EOF // clean end between frames
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	l := int(binary.BigEndian.Uint16(lb[:]))
	switch {
	case want != 0 && l != want:
		return nil, errorf(CodeMalformed, "record of %d bytes where the frame needs %d", l, want)
	case l < TagSize+minPlain:
		return nil, errorf(CodeMalformed, "record of %d bytes is too short", l)
	}
	n, err = io.ReadFull(r.r, r.ct[:l])
	r.read.Add(int64(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	pt, err := r.cs.Decrypt(dst, nil, r.ct[:l])
	if err != nil {
		return nil, wrapErr(CodeDecrypt, "", err)
	}
	return pt, nil
}

// readFrame reads one frame. check validates the header against the link's
// spec before any payload is read; buffer returns room for the payload of
// the validated length (the link reserves that memory first).
func (r *recordReader) readFrame(check func(*header) error, buffer func(n int) ([]byte, error)) (header, []byte, error) {
	pt, err := r.readRecord(r.first[:0], 0, HeaderSize, true)
	if err != nil {
		return header{}, nil, err
	}
	h, err := decodeHeader(pt)
	if err != nil {
		return h, nil, err
	}
	if err := check(&h); err != nil {
		return h, nil, err
	}
	total := int(h.Length) // ≤ MaxFramePayload, checked by decodeHeader
	first := min(total, firstChunk)
	if len(pt)-HeaderSize != first {
		return h, nil, errorf(CodeMalformed, "first record carries %d payload bytes, the frame needs %d", len(pt)-HeaderSize, first)
	}
	payload, err := buffer(total)
	if err != nil {
		return h, nil, err
	}
	copy(payload, pt[HeaderSize:])
	for off := first; off < total; {
		chunk := min(total-off, MaxRecordPlaintext)
		got, err := r.readRecord(payload[off:off], chunk+TagSize, 0, false)
		if err != nil {
			return h, nil, err
		}
		if len(got) != chunk {
			return h, nil, errorf(CodeMalformed, "record opened to %d bytes, want %d", len(got), chunk)
		}
		off += chunk
	}
	return h, payload, nil
}
