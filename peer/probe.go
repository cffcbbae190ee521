package peer

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// ProbeProtocol is a connectivity probe: the caller sends a payload, the
// callee hashes it and answers with the hash. The caller learns whether
// the path carries data intact, how fast, and whether it is direct or
// relayed: the question "can my node reach that peer directly?".
//
// Wire, all integers big-endian:
//
//	caller → callee: payload length (8 bytes, ≤ MaxProbeBytes), payload,
//	                 then the caller half-closes
//	callee → caller: bytes received (8 bytes), SHA-256 of them (32 bytes)
const ProbeProtocol protocol.ID = "/holopeer/probe/1.0.0"

// MaxProbeBytes bounds one probe's payload; the callee refuses larger
// ones before reading any payload.
const MaxProbeBytes = 1 << 30

const (
	probeHeaderLen   = 8
	probeReplyLen    = 8 + sha256.Size
	maxProbesServed  = 4 // concurrent probes a node answers; more are reset
	probeTimeout     = 2 * time.Minute
	probeChunk       = 1 << 20
	defaultProbeSize = 16 << 20
)

// ErrProbeCorrupted is returned when the callee's hash or count differs
// from what was sent.
var ErrProbeCorrupted = errors.New("probe payload did not arrive intact")

// ProbeOptions shape one probe.
type ProbeOptions struct {
	Bytes      int64         // payload size (default 16 MiB)
	DirectOnly bool          // wait for a direct connection; never use a relay
	Timeout    time.Duration // whole probe (default 2 minutes)
}

// ProbeResult is what a probe measured.
type ProbeResult struct {
	Peer       lpeer.ID
	Bytes      int64
	SHA256     string // hex; the same at both ends
	Elapsed    time.Duration
	Conn       ConnType // the connection the payload crossed
	RemoteAddr string
}

// MiBps is the payload throughput.
func (r ProbeResult) MiBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / (1 << 20) / r.Elapsed.Seconds()
}

// Probe sends a random payload to p and checks that p received it intact.
// Unless opts.DirectOnly, it may cross a relay, which the caller asked for
// by probing (relays cap how much one connection carries; see
// DefaultRelayLimit).
func (n *Host) Probe(ctx context.Context, p lpeer.ID, opts ProbeOptions) (ProbeResult, error) {
	if opts.Bytes == 0 {
		opts.Bytes = defaultProbeSize
	}
	if opts.Bytes < 0 || opts.Bytes > MaxProbeBytes {
		return ProbeResult{}, fmt.Errorf("probe size %d: use 1 byte to %d", opts.Bytes, MaxProbeBytes)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = probeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if !opts.DirectOnly {
		ctx = network.WithAllowLimitedConn(ctx, "probe")
	}
	s, err := n.h.NewStream(ctx, p, ProbeProtocol)
	if err != nil {
		if opts.DirectOnly && n.ConnTypeTo(p) == ConnRelayed {
			return ProbeResult{}, fmt.Errorf("probe %s: no direct connection within %v (only a relayed one): %w", p, opts.Timeout, err)
		}
		return ProbeResult{}, fmt.Errorf("probe %s: %w", p, err)
	}
	res := ProbeResult{Peer: p, Bytes: opts.Bytes, Conn: ConnDirect, RemoteAddr: s.Conn().RemoteMultiaddr().String()}
	if s.Conn().Stat().Limited || isRelayAddr(s.Conn().RemoteMultiaddr()) {
		res.Conn = ConnRelayed
	}
	fail := func(err error) (ProbeResult, error) {
		s.Reset()
		if res.Conn == ConnRelayed {
			return res, fmt.Errorf("probe %s over a relay: %w (relays cap each connection; see the relay's limits)", p, err)
		}
		return res, fmt.Errorf("probe %s: %w", p, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return fail(err)
	}
	start := time.Now()
	var hdr [probeHeaderLen]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(opts.Bytes))
	if _, err := s.Write(hdr[:]); err != nil {
		return fail(err)
	}
	sum := sha256.New()
	payload := io.LimitReader(mrand.NewChaCha8(seed), opts.Bytes)
	buf := make([]byte, probeChunk)
	if _, err := io.CopyBuffer(io.MultiWriter(s, sum), payload, buf); err != nil {
		return fail(err)
	}
	if err := s.CloseWrite(); err != nil {
		return fail(err)
	}
	got, digest, err := readProbeReply(s)
	if err != nil {
		return fail(err)
	}
	res.Elapsed = time.Since(start)
	s.Close()
	res.SHA256 = hex.EncodeToString(sum.Sum(nil))
	if got != opts.Bytes || hex.EncodeToString(digest[:]) != res.SHA256 {
		return res, fmt.Errorf("%w: sent %d bytes with sha256 %s, %s received %d with %x", ErrProbeCorrupted, opts.Bytes, res.SHA256, p, got, digest)
	}
	n.log.Info("probe", "peer", p, "bytes", res.Bytes, "conn", res.Conn, "elapsed", res.Elapsed.Round(time.Millisecond), "MiB/s", fmt.Sprintf("%.1f", res.MiBps()))
	return res, nil
}

// serveProbe hashes what a caller sends and answers with the hash.
func (n *Host) serveProbe(s network.Stream) {
	_ = s.Scope().SetService("holopeer.probe")
	select {
	case n.probeSlots <- struct{}{}:
		defer func() { <-n.probeSlots }()
	default:
		s.Reset() // busy: a probe is a diagnostic, not a service to queue for
		return
	}
	_ = s.SetDeadline(time.Now().Add(probeTimeout))
	size, err := readProbeHeader(s)
	if err != nil {
		n.log.Debug("probe refused", "peer", s.Conn().RemotePeer(), "err", err)
		s.Reset()
		return
	}
	sum := sha256.New()
	got, err := io.CopyN(sum, s, size)
	if err != nil {
		n.log.Debug("probe cut short", "peer", s.Conn().RemotePeer(), "got", got, "want", size, "err", err)
		s.Reset()
		return
	}
	// Wait for the caller's half-close before answering: closing our
	// side first would cancel its write side under it (QUIC STOP_SENDING).
	var extra [1]byte
	if k, err := s.Read(extra[:]); k != 0 || !errors.Is(err, io.EOF) {
		n.log.Debug("probe longer than announced", "peer", s.Conn().RemotePeer(), "want", size)
		s.Reset()
		return
	}
	var reply [probeReplyLen]byte
	binary.BigEndian.PutUint64(reply[:8], uint64(got))
	copy(reply[8:], sum.Sum(nil))
	if _, err := s.Write(reply[:]); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// readProbeHeader reads the payload length and refuses one over
// MaxProbeBytes.
func readProbeHeader(r io.Reader) (int64, error) {
	var hdr [probeHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, fmt.Errorf("probe header: %w", err)
	}
	size := binary.BigEndian.Uint64(hdr[:])
	if size > MaxProbeBytes {
		return 0, fmt.Errorf("probe of %d bytes exceeds %d", size, MaxProbeBytes)
	}
	return int64(size), nil
}

// readProbeReply reads the callee's count and hash.
func readProbeReply(r io.Reader) (int64, [sha256.Size]byte, error) {
	var b [probeReplyLen]byte
	var digest [sha256.Size]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, digest, fmt.Errorf("probe reply: %w", err)
	}
	got := binary.BigEndian.Uint64(b[:8])
	if got > MaxProbeBytes {
		return 0, digest, fmt.Errorf("probe reply claims %d bytes, over %d", got, MaxProbeBytes)
	}
	copy(digest[:], b[8:])
	return int64(got), digest, nil
}
