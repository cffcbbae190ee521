package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/holopeer/holopeer/stage/wire"
)

// Control messages ride in wire control frames (at most
// wire.MaxControlPayload bytes). The first byte says what follows:
//
//	msgCtl:   a JSON-encoded Ctl
//	msgChunk: raw bytes of the blob announced by the last Ctl{Op: opBlob}
//
// WARNING: ONLY APPEND TO THIS LIST! The byte is seen by other versions.
const (
	msgCtl   byte = 1
	msgChunk byte = 2
)

// Ops of a Ctl. Requests go from the researcher's driver to a stage
// worker; each has a reply of the same op unless noted.
const (
	opReady    = "ready"    // worker → driver: links up, weights loaded (no reply)
	opSumSq    = "sumsq"    // driver asks for Σg² of the stage's gradients
	opGrads    = "grads"    // driver asks a replica for its gradients (reply: blob)
	opGradSum  = "gradsum"  // driver sends replicas their summed gradients (blob follows)
	opApply    = "apply"    // driver: apply step Step with LR and Scale
	opAbort    = "abort"    // driver: drop the step in flight and zero gradients
	opShard    = "shard"    // driver asks for the stage's shard (reply: blob)
	opRestore  = "restore"  // driver: reset to checkpoint Step (blob follows unless Init)
	opDone     = "done"     // driver: job finished; worker exits (no reply)
	opLost     = "lost"     // worker → driver: link to Peer failed (no reply)
	opError    = "error"    // either way: Err says why (no reply)
	opBlob     = "blob"     // a blob of Size bytes follows in chunks, then opBlobEnd
	opApplied  = "applied"  // worker → driver: step applied (reply to apply)
	opRestored = "restored" // worker → driver: reset done (reply to restore)
	opStats    = "stats"    // driver asks for the compute time and tokens so far (for receipts)
	opBlobEnd  = "blobend"  // closes a blob: Hash is the SHA-256 of its bytes
)

// Ctl is one control message.
type Ctl struct {
	Op    string  `json:"op"`
	Step  uint64  `json:"step,omitempty"`
	Gen   uint64  `json:"gen,omitempty"`
	LR    float64 `json:"lr,omitempty"`
	Scale float64 `json:"scale,omitempty"`
	SumSq float64 `json:"sumsq,omitempty"`
	Init  bool    `json:"init,omitempty"`
	Name  string  `json:"name,omitempty"`
	Size  int64   `json:"size,omitempty"`
	Hash  []byte  `json:"hash,omitempty"`
	Peer  string  `json:"peer,omitempty"`
	Err   string  `json:"err,omitempty"`
	// Work done so far by a stage node (reply to stats).
	ComputeS float64 `json:"compute_s,omitempty"`
	Tokens   int64   `json:"tokens,omitempty"`
}

// maxChunk is the blob payload per control frame.
const maxChunk = wire.MaxControlPayload - 1

func encodeCtl(c Ctl) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	if len(b)+1 > wire.MaxControlPayload {
		return nil, fmt.Errorf("pipeline: control message of %d bytes", len(b)+1)
	}
	return append([]byte{msgCtl}, b...), nil
}

// decodeCtl parses a control payload that must be a Ctl.
func decodeCtl(p []byte) (Ctl, error) {
	var c Ctl
	if len(p) == 0 || p[0] != msgCtl {
		return c, errors.New("pipeline: control frame is not a control message")
	}
	dec := json.NewDecoder(bytes.NewReader(p[1:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("pipeline: bad control message: %w", err)
	}
	if c.Op == "" || len(c.Op) > 16 || len(c.Name) > 256 || len(c.Err) > 1024 || len(c.Peer) > 128 || len(c.Hash) > 64 {
		return c, errors.New("pipeline: control message fields out of bounds")
	}
	return c, nil
}

func sendCtl(ctx context.Context, l frameLink, c Ctl) error {
	p, err := encodeCtl(c)
	if err != nil {
		return err
	}
	return l.Send(ctx, wire.Frame{Kind: wire.KindControl, Step: c.Step, Control: p})
}

// frameLink is the part of a wire.Link a blob travels over.
type frameLink interface {
	Send(ctx context.Context, f wire.Frame) error
	Recv(ctx context.Context) (wire.Frame, error)
}

// A blob travels as Ctl{Op: opBlob, Name, Size}, Size bytes of chunks,
// then Ctl{Op: opBlobEnd, Hash}: the SHA-256 comes last, so that neither
// side ever holds the blob whole (a shard streams from a stage's memory
// to the researcher's disk). Sizes are 64-bit.

// sendBlob announces and streams b.
func sendBlob(ctx context.Context, l frameLink, hdr Ctl, b []byte) error {
	return sendBlobFrom(ctx, l, hdr, int64(len(b)), func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// sendBlobFrom announces a blob of size bytes and streams what write
// writes, which must be exactly size bytes; hdr carries the request's
// context (Name, Step, Gen).
func sendBlobFrom(ctx context.Context, l frameLink, hdr Ctl, size int64, write func(io.Writer) error) error {
	hdr.Op, hdr.Size, hdr.Hash = opBlob, size, nil
	if err := sendCtl(ctx, l, hdr); err != nil {
		return err
	}
	cw := &chunkWriter{ctx: ctx, l: l, step: hdr.Step, h: sha256.New(), buf: make([]byte, 1, wire.MaxControlPayload)}
	cw.buf[0] = msgChunk
	if err := write(cw); err != nil {
		return fmt.Errorf("pipeline: blob %q: %w", hdr.Name, err)
	}
	if err := cw.flush(); err != nil {
		return err
	}
	if cw.n != size {
		return fmt.Errorf("pipeline: blob %q: wrote %d bytes of the %d announced", hdr.Name, cw.n, size)
	}
	return sendCtl(ctx, l, Ctl{Op: opBlobEnd, Name: hdr.Name, Step: hdr.Step, Hash: cw.h.Sum(nil)})
}

// chunkWriter cuts what is written into chunk frames, hashing it.
type chunkWriter struct {
	ctx  context.Context
	l    frameLink
	step uint64
	h    hash.Hash
	buf  []byte // msgChunk, then up to maxChunk bytes
	n    int64
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		k := min(len(p), maxChunk-(len(c.buf)-1))
		c.buf = append(c.buf, p[:k]...)
		p, written = p[k:], written+k
		if len(c.buf)-1 == maxChunk {
			if err := c.flush(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

func (c *chunkWriter) flush() error {
	if len(c.buf) == 1 {
		return nil
	}
	c.h.Write(c.buf[1:])
	c.n += int64(len(c.buf) - 1)
	err := c.l.Send(c.ctx, wire.Frame{Kind: wire.KindControl, Step: c.step, Control: c.buf})
	c.buf = c.buf[:1]
	return err
}

// ErrBlobTooLarge marks a blob larger than its receiver expects.
var ErrBlobTooLarge = errors.New("pipeline: blob too large")

// recvBlob reads the blob announced by hdr into memory, refusing one
// larger than limit before allocating.
func recvBlob(ctx context.Context, l frameLink, hdr Ctl, limit int64) ([]byte, error) {
	if err := checkBlob(hdr, limit); err != nil {
		return nil, err
	}
	buf := bytes.NewBuffer(make([]byte, 0, hdr.Size))
	if err := recvBlobTo(ctx, l, hdr, limit, buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func checkBlob(hdr Ctl, limit int64) error {
	if hdr.Size < 0 || hdr.Size > limit {
		return fmt.Errorf("%w: %q is %d bytes; at most %d were expected", ErrBlobTooLarge, hdr.Name, hdr.Size, limit)
	}
	return nil
}

// recvBlobTo copies the blob announced by hdr to w chunk by chunk,
// refusing it before the first byte when it is larger than limit, and
// checks the trailing SHA-256. w holds a blob only once this returns nil.
func recvBlobTo(ctx context.Context, l frameLink, hdr Ctl, limit int64, w io.Writer) error {
	if err := checkBlob(hdr, limit); err != nil {
		return err
	}
	h := sha256.New()
	var got int64
	for got < hdr.Size {
		f, err := l.Recv(ctx)
		if err != nil {
			return err
		}
		if f.Kind != wire.KindControl || len(f.Control) == 0 || f.Control[0] != msgChunk {
			return fmt.Errorf("pipeline: blob %q interrupted by a %s frame", hdr.Name, f.Kind)
		}
		chunk := f.Control[1:]
		if got+int64(len(chunk)) > hdr.Size {
			return fmt.Errorf("pipeline: blob %q longer than the %d bytes announced", hdr.Name, hdr.Size)
		}
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return fmt.Errorf("pipeline: blob %q: %w", hdr.Name, err)
		}
		got += int64(len(chunk))
	}
	f, err := l.Recv(ctx)
	if err != nil {
		return err
	}
	if f.Kind != wire.KindControl {
		return fmt.Errorf("pipeline: blob %q not closed by its hash", hdr.Name)
	}
	end, err := decodeCtl(f.Control)
	if err != nil || end.Op != opBlobEnd {
		return fmt.Errorf("pipeline: blob %q not closed by its hash", hdr.Name)
	}
	if !bytes.Equal(h.Sum(nil), end.Hash) {
		return fmt.Errorf("%w: %q", ErrBlobCorrupt, hdr.Name)
	}
	return nil
}

// ErrBlobCorrupt marks a blob whose bytes do not match its SHA-256.
var ErrBlobCorrupt = errors.New("pipeline: blob fails its SHA-256")
