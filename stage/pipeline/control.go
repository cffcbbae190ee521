package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

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
	opBlob     = "blob"     // a blob of Size bytes with SHA-256 Hash follows in chunks
	opApplied  = "applied"  // worker → driver: step applied (reply to apply)
	opRestored = "restored" // worker → driver: reset done (reply to restore)
	opStats    = "stats"    // driver asks for the compute time and tokens so far (for receipts)
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

func sendCtl(ctx context.Context, l *wire.Link, c Ctl) error {
	p, err := encodeCtl(c)
	if err != nil {
		return err
	}
	return l.Send(ctx, wire.Frame{Kind: wire.KindControl, Step: c.Step, Control: p})
}

// sendBlob announces and streams b as chunks after a Ctl whose Op is
// opBlob; hdr carries the request's context (Name, Step).
func sendBlob(ctx context.Context, l *wire.Link, hdr Ctl, b []byte) error {
	sum := sha256.Sum256(b)
	hdr.Op, hdr.Size, hdr.Hash = opBlob, int64(len(b)), sum[:]
	if err := sendCtl(ctx, l, hdr); err != nil {
		return err
	}
	chunk := make([]byte, 0, wire.MaxControlPayload)
	for off := 0; off < len(b); off += maxChunk {
		chunk = append(chunk[:0], msgChunk)
		chunk = append(chunk, b[off:min(off+maxChunk, len(b))]...)
		if err := l.Send(ctx, wire.Frame{Kind: wire.KindControl, Step: hdr.Step, Control: chunk}); err != nil {
			return err
		}
	}
	return nil
}

// recvBlob reads the chunks of a blob announced by hdr, refusing one
// larger than limit before allocating and checking its hash at the end.
func recvBlob(ctx context.Context, l *wire.Link, hdr Ctl, limit int64) ([]byte, error) {
	if hdr.Size < 0 || hdr.Size > limit {
		return nil, fmt.Errorf("pipeline: blob %q of %d bytes exceeds the %d-byte limit", hdr.Name, hdr.Size, limit)
	}
	if len(hdr.Hash) != sha256.Size {
		return nil, fmt.Errorf("pipeline: blob %q without a SHA-256", hdr.Name)
	}
	b := make([]byte, 0, hdr.Size)
	for int64(len(b)) < hdr.Size {
		f, err := l.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if f.Kind != wire.KindControl || len(f.Control) == 0 || f.Control[0] != msgChunk {
			return nil, fmt.Errorf("pipeline: blob %q interrupted by a %s frame", hdr.Name, f.Kind)
		}
		chunk := f.Control[1:]
		if int64(len(b)+len(chunk)) > hdr.Size {
			return nil, fmt.Errorf("pipeline: blob %q longer than announced", hdr.Name)
		}
		b = append(b, chunk...)
	}
	if sum := sha256.Sum256(b); !bytes.Equal(sum[:], hdr.Hash) {
		return nil, fmt.Errorf("pipeline: blob %q fails its SHA-256", hdr.Name)
	}
	return b, nil
}
