package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/flynn/noise"
)

// batchRecords is how many records the writer seals, and the reader opens,
// as one batch: one Write of about 1 MiB (large writes amortise the muxer's
// per-write cost) whose records are sealed on several cores at once.
const batchRecords = 16

// batchBytes is the largest batch on the wire.
const batchBytes = batchRecords * (recordPrefix + MaxRecord)

// recordCipher seals and opens records with explicit nonces, so that the
// records of one batch can be sealed (or opened) on several cores at once.
// The wire is unchanged: a session's i-th record still uses nonce i, as
// noise.CipherState would give it.
type recordCipher struct {
	c noise.Cipher
	n uint64 // nonce of the next record
}

// newRecordCipher takes over cs's key and nonce; cs must not be used again.
func newRecordCipher(cs *noise.CipherState) recordCipher {
	n := cs.Nonce()
	return recordCipher{c: cs.Cipher(), n: n}
}

// reserve hands out the nonces of the next k records.
func (c *recordCipher) reserve(k int) (uint64, error) {
	if c.n > noise.MaxNonce || uint64(k) > noise.MaxNonce-c.n+1 {
		return 0, fmt.Errorf("wire: %w", noise.ErrMaxNonce)
	}
	n := c.n
	c.n += uint64(k)
	return n, nil
}

// parallel runs f(0..n-1) in contiguous runs on up to GOMAXPROCS goroutines
// and returns the first error. Sealing a MiB takes about half a
// millisecond, so starting goroutines per batch costs nothing that shows.
func parallel(n int, f func(i int) error) error {
	workers := min(n, runtime.GOMAXPROCS(0))
	run := func(lo, hi int) error {
		for i := lo; i < hi; i++ {
			if err := f(i); err != nil {
				return err
			}
		}
		return nil
	}
	if workers <= 1 {
		return run(0, n)
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := 1; k < workers; k++ {
		wg.Go(func() { errs[k] = run(k*n/workers, (k+1)*n/workers) })
	}
	errs[0] = run(0, n/workers)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // the earliest record's, as a sequential opener would report
		}
	}
	return nil
}

// recordWriter seals plaintext into records (2-byte length, ciphertext) and
// writes them in batches. It is owned by whoever holds the link's send lock.
//
// Sealing and writing overlap: while one batch is being written (through
// the muxer and libp2p's own security) the next is sealed into the spare
// buffer, so a large frame keeps several cores busy. writeFrame still
// returns only after every byte was handed to w.
type recordWriter struct {
	c           recordCipher
	w           io.Writer
	buf         []byte // sealed records not yet written
	spare       []byte // the other buffer, idle or being written
	inflight    chan writeResult
	scratch     []byte            // plaintext of a frame's first record
	offs        [batchRecords]int // where each record of a batch goes in buf
	written     atomic.Int64      // bytes handed to w; read by Stats
	beforeWrite func() error
}

type writeResult struct {
	n   int
	err error
}

func newRecordWriter(cs *noise.CipherState, w io.Writer, beforeWrite func() error) *recordWriter {
	return &recordWriter{c: newRecordCipher(cs), w: w, beforeWrite: beforeWrite,
		buf: make([]byte, 0, batchBytes), spare: make([]byte, 0, batchBytes),
		scratch: make([]byte, 0, MaxRecordPlaintext)}
}

// seal appends one record.
func (w *recordWriter) seal(pt []byte) error {
	return w.sealBatch(1, func(int) []byte { return pt })
}

// sealBatch appends k records (k ≤ batchRecords), the i-th holding
// plaintext pt(i), sealing them in parallel, and starts writing the batch
// once it is full. Noise messages are limited to 65535 bytes and
// flynn/noise does not check that on Encrypt, so this does.
func (w *recordWriter) sealBatch(k int, pt func(i int) []byte) error {
	if len(w.buf)+k*(recordPrefix+MaxRecord) > cap(w.buf) {
		if err := w.startWrite(); err != nil {
			return err
		}
	}
	for i := range k {
		if l := len(pt(i)); l > MaxRecordPlaintext {
			return fmt.Errorf("wire: record plaintext of %d bytes exceeds %d", l, MaxRecordPlaintext)
		}
	}
	n0, err := w.c.reserve(k)
	if err != nil {
		return err
	}
	offs := w.offs[:k]
	for i := range k {
		l := len(pt(i))
		w.buf = binary.BigEndian.AppendUint16(w.buf, uint16(l+TagSize))
		offs[i] = len(w.buf)
		w.buf = w.buf[:len(w.buf)+l+TagSize]
	}
	_ = parallel(k, func(i int) error {
		p := pt(i)
		w.c.c.Encrypt(w.buf[offs[i]:offs[i]:offs[i]+len(p)+TagSize], n0+uint64(i), nil, p)
		return nil
	})
	if len(w.buf) >= flushSize {
		return w.startWrite()
	}
	return nil
}

// flushSize is how much ciphertext the writer gathers before one Write.
const flushSize = batchBytes - (recordPrefix + MaxRecord)

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

// frameRecords is how many records carry a payload of n bytes: the first
// (header and the start of the payload), then full records, the last short.
func frameRecords(n int) int {
	if n <= firstChunk {
		return 1
	}
	return 1 + (n-firstChunk+MaxRecordPlaintext-1)/MaxRecordPlaintext
}

// chunkOf is the payload bytes record i (i ≥ 1) of a frame carries.
func chunkOf(payload []byte, i int) []byte {
	off := firstChunk + (i-1)*MaxRecordPlaintext
	return payload[off:min(len(payload), off+MaxRecordPlaintext)]
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
	records := frameRecords(len(payload))
	for lo := 0; lo < records; lo += batchRecords {
		err := w.sealBatch(min(batchRecords, records-lo), func(i int) []byte {
			if lo+i == 0 {
				return pt
			}
			return chunkOf(payload, lo+i)
		})
		if err != nil {
			return err
		}
	}
	return w.flush()
}

// recordReader opens records. It is owned by whoever holds the link's
// receive lock.
type recordReader struct {
	c          recordCipher
	r          io.Reader
	ct         []byte       // a batch of records' ciphertext
	first      []byte       // plaintext of a frame's first record
	read       atomic.Int64 // bytes taken from r; read by Stats
	beforeRead func(first bool) error
}

func newRecordReader(cs *noise.CipherState, r io.Reader, beforeRead func(first bool) error) *recordReader {
	return &recordReader{c: newRecordCipher(cs), r: r, beforeRead: beforeRead,
		ct: make([]byte, batchRecords*MaxRecord), first: make([]byte, 0, MaxRecordPlaintext)}
}

// readCiphertext reads one record into ct, whose length must be want (0:
// any length that holds at least minPlain plaintext bytes), and returns
// the ciphertext. The length is checked before the body is read.
func (r *recordReader) readCiphertext(ct []byte, want, minPlain int, first bool) ([]byte, error) {
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
	n, err = io.ReadFull(r.r, ct[:l])
	r.read.Add(int64(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return ct[:l], nil
}

// open decrypts ct with nonce n, appending the plaintext to dst.
func (r *recordReader) open(dst, ct []byte, n uint64) ([]byte, error) {
	pt, err := r.c.c.Decrypt(dst, n, nil, ct)
	if err != nil {
		return nil, wrapErr(CodeDecrypt, "", err)
	}
	return pt, nil
}

// readFrame reads one frame. check validates the header against the link's
// spec before any payload is read; buffer returns room for the payload of
// the validated length (the link reserves that memory first). The payload
// records are read a batch at a time and each batch is opened in parallel.
func (r *recordReader) readFrame(check func(*header) error, buffer func(n int) ([]byte, error)) (header, []byte, error) {
	ct, err := r.readCiphertext(r.ct, 0, HeaderSize, true)
	if err != nil {
		return header{}, nil, err
	}
	n, err := r.c.reserve(1)
	if err != nil {
		return header{}, nil, err
	}
	pt, err := r.open(r.first[:0], ct, n)
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
	records := frameRecords(total)
	var cts [batchRecords][]byte
	for lo := 1; lo < records; lo += batchRecords {
		k := min(batchRecords, records-lo)
		for i := range k {
			want := len(chunkOf(payload, lo+i)) + TagSize
			if cts[i], err = r.readCiphertext(r.ct[i*MaxRecord:], want, 0, false); err != nil {
				return h, nil, err
			}
		}
		n0, err := r.c.reserve(k)
		if err != nil {
			return h, nil, err
		}
		err = parallel(k, func(i int) error {
			_, err := r.open(chunkOf(payload, lo+i)[:0], cts[i], n0+uint64(i))
			return err
		})
		if err != nil {
			return h, nil, err
		}
	}
	return h, payload, nil
}
