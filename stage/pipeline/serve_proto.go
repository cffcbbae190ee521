package pipeline

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Serving messages. A serving job uses the same links as training, with
// forward frames only. Every forward frame is announced by a batch
// message in the control frame just before it on the same link, saying
// which sequences the frame's tokens belong to:
//
//	msgServe, version, kind, uvarint frame, uvarint lane, uvarint count,
//	then count entries of uvarint id, pos, n, first (batch)
//	                or uvarint id                   (drop)
//
// A batch entry is n tokens of sequence id, entering a stage whose cache
// of the sequence holds pos tokens (pos 0 starts the sequence afresh).
// The stage runs them as the single-process generator does: the first
// `first` tokens in one call (a prompt's prefill), then the rest one at a
// time (decoding, or a replay of tokens decoded before a failover), so
// that the swarm computes bit for bit what one process would. The tokens
// of the entries are the frame's rows, in entry order.
//
// frame numbers the researcher's frames (the reply names the request);
// the forward frame's own Step is a per-link counter, since a stage that
// merges lanes from several upstream replicas may reorder them. lane
// routes the frame: stage s sends it on to replica lane mod R of stage
// s+1, so each sequence's caches stay on one replica per stage.
//
// A drop message frees the entries' caches on the stages of its lane; it
// travels the lane's path like a batch, so it never overtakes one.
const msgServe byte = 3 // in control.go's list of message bytes

const serveVersion = 1

// Kinds of serving message. WARNING: ONLY APPEND TO THIS LIST!
const (
	serveBatch byte = 1
	serveDrop  byte = 2
)

// Limits on a serving message, checked before anything is allocated.
const (
	// maxSeqsPerFrame bounds the entries of one message; with four
	// uvarints of at most 5 bytes each (ids up to 2^35) it keeps a message
	// under wire.MaxControlPayload.
	maxSeqsPerFrame = 128
	// maxSeqTokens bounds pos and n (a model's context is at most 2^17).
	maxSeqTokens = 1 << 20
	maxSeqID     = 1<<35 - 1
)

// Serving control ops (in a Ctl), beside those of control.go.
const (
	opLoad    = "load"    // worker → researcher: send my span's weights (reply: blob "weights")
	opWeights = "weights" // the name of the weights blob
	opPing    = "ping"    // either way, on every link: keeps idle links open (no reply)
)

// seqEntry is one sequence's share of a batch.
type seqEntry struct {
	ID    uint64
	Pos   int
	N     int
	First int
}

// calls lists the sizes of the Infer calls an entry runs as.
func (e seqEntry) calls() []int {
	out := make([]int, 0, 1+e.N-e.First)
	out = append(out, e.First)
	for i := e.First; i < e.N; i++ {
		out = append(out, 1)
	}
	return out
}

// lastCall is the size of an entry's last Infer call: the rows whose
// logits the head computes (only the last row's are used).
func (e seqEntry) lastCall() int {
	if e.N == e.First {
		return e.N
	}
	return 1
}

// serveMsg is a decoded serving message.
type serveMsg struct {
	Kind  byte
	Frame uint64
	Lane  uint32
	Seqs  []seqEntry
}

// tokens is the number of rows the batch's frame holds.
func (m *serveMsg) tokens() int {
	n := 0
	for _, e := range m.Seqs {
		n += e.N
	}
	return n
}

var errServeMsg = errors.New("pipeline: bad serving message")

func encodeServeMsg(m serveMsg) ([]byte, error) {
	if len(m.Seqs) == 0 || len(m.Seqs) > maxSeqsPerFrame {
		return nil, fmt.Errorf("%w: %d sequences (1 to %d)", errServeMsg, len(m.Seqs), maxSeqsPerFrame)
	}
	b := make([]byte, 0, 16+len(m.Seqs)*16)
	b = append(b, msgServe, serveVersion, m.Kind)
	b = binary.AppendUvarint(b, m.Frame)
	b = binary.AppendUvarint(b, uint64(m.Lane))
	b = binary.AppendUvarint(b, uint64(len(m.Seqs)))
	for _, e := range m.Seqs {
		if err := e.check(m.Kind); err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, e.ID)
		if m.Kind == serveBatch {
			b = binary.AppendUvarint(b, uint64(e.Pos))
			b = binary.AppendUvarint(b, uint64(e.N))
			b = binary.AppendUvarint(b, uint64(e.First))
		}
	}
	return b, nil
}

func (e seqEntry) check(kind byte) error {
	if e.ID > maxSeqID {
		return fmt.Errorf("%w: sequence id %d", errServeMsg, e.ID)
	}
	if kind != serveBatch {
		return nil
	}
	if e.Pos < 0 || e.Pos > maxSeqTokens || e.N < 1 || e.N > maxSeqTokens || e.First < 1 || e.First > e.N {
		return fmt.Errorf("%w: sequence %d: pos %d, %d tokens, first call %d", errServeMsg, e.ID, e.Pos, e.N, e.First)
	}
	return nil
}

// decodeServeMsg parses a control payload that starts with msgServe.
func decodeServeMsg(p []byte) (serveMsg, error) {
	var m serveMsg
	if len(p) < 3 || p[0] != msgServe {
		return m, fmt.Errorf("%w: not a serving message", errServeMsg)
	}
	if p[1] != serveVersion {
		return m, fmt.Errorf("%w: version %d, this node speaks %d", errServeMsg, p[1], serveVersion)
	}
	m.Kind = p[2]
	if m.Kind != serveBatch && m.Kind != serveDrop {
		return m, fmt.Errorf("%w: unknown kind %d", errServeMsg, m.Kind)
	}
	r := p[3:]
	next := func(limit uint64, what string) (uint64, error) {
		v, k := binary.Uvarint(r)
		if k <= 0 {
			return 0, fmt.Errorf("%w: truncated %s", errServeMsg, what)
		}
		if v > limit {
			return 0, fmt.Errorf("%w: %s %d exceeds %d", errServeMsg, what, v, limit)
		}
		r = r[k:]
		return v, nil
	}
	var err error
	if m.Frame, err = next(1<<63, "frame"); err != nil {
		return m, err
	}
	lane, err := next(1<<16, "lane")
	if err != nil {
		return m, err
	}
	m.Lane = uint32(lane)
	n, err := next(maxSeqsPerFrame, "count")
	if err != nil {
		return m, err
	}
	if n == 0 {
		return m, fmt.Errorf("%w: no sequences", errServeMsg)
	}
	m.Seqs = make([]seqEntry, n)
	seen := make(map[uint64]bool, n)
	for i := range m.Seqs {
		e := &m.Seqs[i]
		if e.ID, err = next(maxSeqID, "sequence id"); err != nil {
			return m, err
		}
		if seen[e.ID] {
			return m, fmt.Errorf("%w: sequence %d twice", errServeMsg, e.ID)
		}
		seen[e.ID] = true
		if m.Kind != serveBatch {
			continue
		}
		var pos, cnt, first uint64
		if pos, err = next(maxSeqTokens, "pos"); err != nil {
			return m, err
		}
		if cnt, err = next(maxSeqTokens, "tokens"); err != nil {
			return m, err
		}
		if first, err = next(maxSeqTokens, "first call"); err != nil {
			return m, err
		}
		e.Pos, e.N, e.First = int(pos), int(cnt), int(first)
		if err := e.check(m.Kind); err != nil {
			return m, err
		}
	}
	if len(r) != 0 {
		return m, fmt.Errorf("%w: %d trailing bytes", errServeMsg, len(r))
	}
	return m, nil
}
