package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

// Frame is one message on a link.
type Frame struct {
	Kind  Kind
	Step  uint64
	Micro uint32
	// Data holds Tokens × d_model values for forward and backward frames:
	// what the sender passed to Send, as rebuilt by the codec.
	Data []float32
	// IDs are the microbatch's token ids. Subspace codecs need them forward
	// (the receiver rebuilds E_fix[id]) and carry them; other codecs ignore
	// them and Recv leaves them nil.
	IDs []int
	// Tokens is the number of tokens; Send derives it from Data, Recv sets
	// it from the header.
	Tokens int
	// Control is the payload of a control frame (at most MaxControlPayload
	// bytes).
	Control []byte
}

// Stats counts what crossed a link.
type Stats struct {
	FramesSent, FramesRecv   uint64
	TokensSent, TokensRecv   uint64
	BytesSent, BytesRecv     int64 // on the stream: records, lengths and tags included
	PayloadSent, PayloadRecv int64 // codec payload bytes
	// TensorBytesSent and TensorBytesRecv are the stream bytes of the
	// forward and backward frames alone (records, lengths and tags
	// included): what the activations cost on the socket.
	TensorBytesSent, TensorBytesRecv int64
	// TensorTokensSent and TensorTokensRecv are the tokens those frames
	// carried.
	TensorTokensSent, TensorTokensRecv uint64
	// LastResidual and MaxResidual are the subspace invariant residuals of
	// the forward frames this node encoded (0 for other codecs).
	LastResidual, MaxResidual float64
}

// Link is an authenticated, encrypted stage-to-stage channel for one job.
// Send and Recv may run concurrently with each other (forward one way,
// backward the other); concurrent Sends are serialised, as are Recvs.
// Any error from Send or Recv, other than a refused Send of a frame that
// was never written, ends the link: the stream is reset and every later
// call returns the same error.
type Link struct {
	// Static after the handshake; no locking required.
	svc    *Service
	s      network.Stream
	job    JobID
	local  peer.ID
	remote peer.ID
	spec   LinkSpec
	log    *slog.Logger

	// sendMu is a one-slot semaphore (so refusals can try it without
	// blocking); its holder owns w and plain.
	sendMu       chan struct{}
	w            *recordWriter
	plain        []byte
	sendDeadline time.Time
	sendCtx      context.Context

	// recvMu's holder owns r, window, payload and recvDeadline.
	recvMu       sync.Mutex
	r            *recordReader
	window       stepWindow
	payload      []byte
	recvDeadline time.Time
	recvCtx      context.Context
	recvEOF      bool // the peer closed its sending side

	// mu guards the following fields.
	mu       sync.Mutex
	err      error // terminal; set once
	reserved int   // bytes reserved from the stream's resource scope
	stats    Stats
}

func newLink(svc *Service, s network.Stream, job JobID, spec LinkSpec, sess session) *Link {
	l := &Link{
		svc: svc, s: s, job: job, spec: spec,
		local: s.Conn().LocalPeer(), remote: s.Conn().RemotePeer(),
		sendMu: make(chan struct{}, 1),
	}
	l.log = svc.cfg.log.With("peer", l.remote.ShortString(), "job", job.String())
	l.w = newRecordWriter(sess.send, s, l.beforeWrite)
	l.r = newRecordReader(sess.recv, s, l.beforeRead)
	return l
}

// Job is the link's job.
func (l *Link) Job() JobID { return l.job }

// RemotePeer is the stage at the other end.
func (l *Link) RemotePeer() peer.ID { return l.remote }

// Spec is the validated spec the link checks frames against.
func (l *Link) Spec() LinkSpec { return l.spec }

// Path reports how the stream travels: "direct" or "relayed". A relayed
// link is still end-to-end encrypted; the relay sees ciphertext and sizes.
func (l *Link) Path() string {
	c := l.s.Conn()
	if c.Stat().Limited {
		return "relayed"
	}
	if _, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT); err == nil {
		return "relayed"
	}
	return "direct"
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats
	st.BytesSent, st.BytesRecv = l.w.written.Load(), l.r.read.Load()
	return st
}

// Err returns the error that ended the link, or nil while it is open.
func (l *Link) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// setErr records the terminal error; the first one wins.
func (l *Link) setErr(err error) (first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	l.err = err
	return true
}

// Send encodes f with the job's codec and writes it. Tensor frames carry
// f.Data (Tokens × d_model) and, for subspace forward frames, f.IDs.
// A frame refused before anything was written (bad shape, subspace
// residual above the spec's MaxResidual) returns an *Error and leaves the
// link open; any failure while writing ends it.
func (l *Link) Send(ctx context.Context, f Frame) error {
	if err := l.Err(); err != nil {
		return err
	}
	select {
	case l.sendMu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.sendMu }()
	if err := l.Err(); err != nil {
		return err
	}
	h, residual, err := l.encode(f)
	if f.Kind == KindForward && l.spec.Codec.ID().Subspace() && residual > 0 {
		l.mu.Lock()
		l.stats.LastResidual = residual
		l.stats.MaxResidual = max(l.stats.MaxResidual, residual)
		l.mu.Unlock()
	}
	if err != nil {
		return err
	}
	return l.write(ctx, &h, l.plain)
}

// write sends an encoded frame; the caller holds sendMu.
func (l *Link) write(ctx context.Context, h *header, payload []byte) error {
	l.sendCtx = ctx
	l.sendDeadline = time.Time{}
	stop := context.AfterFunc(ctx, func() { _ = l.s.SetWriteDeadline(time.Unix(1, 0)) })
	before := l.w.written.Load()
	err := l.w.writeFrame(h, payload)
	stop()
	if err != nil {
		if cerr := ctxErr(ctx); cerr != nil {
			err = fmt.Errorf("wire: send %s step %d: %w", h.Kind, h.Step, cerr)
		}
		return l.abort(codeOf(err), fromStreamError(err, l.remote))
	}
	l.mu.Lock()
	l.stats.FramesSent++
	l.stats.TokensSent += uint64(h.Rows)
	l.stats.PayloadSent += int64(h.Length)
	if h.Kind == KindForward || h.Kind == KindBackward {
		l.stats.TensorBytesSent += l.w.written.Load() - before // the frame was flushed
		l.stats.TensorTokensSent += uint64(h.Rows)
	}
	l.mu.Unlock()
	return nil
}

// encode checks f against the local spec and fills l.plain.
func (l *Link) encode(f Frame) (header, float64, error) {
	h := header{Version: ProtocolVersion, Kind: f.Kind, Job: l.job, Step: f.Step, Micro: f.Micro}
	if l.spec.Microbatches > 0 && f.Micro >= l.spec.Microbatches {
		return h, 0, errorf(CodeStep, "send: microbatch %d, the step has %d", f.Micro, l.spec.Microbatches)
	}
	switch f.Kind {
	case KindControl:
		if len(f.Control) > MaxControlPayload {
			return h, 0, errorf(CodeTooLarge, "send: control payload of %d bytes exceeds %d", len(f.Control), MaxControlPayload)
		}
		l.plain = append(l.plain[:0], f.Control...)
		h.Length = uint64(len(l.plain))
		return h, 0, nil
	case KindForward, KindBackward:
	default:
		return h, 0, errorf(CodeUnexpectedKind, "send: cannot send %s frames", f.Kind)
	}
	c := l.spec.Codec
	d := c.Dim()
	n := len(f.Data) / d
	dir := f.Kind.direction()
	switch {
	case len(f.Data) == 0 || len(f.Data)%d != 0:
		return h, 0, errorf(CodeShape, "send: %d values are not whole tokens of d_model %d", len(f.Data), d)
	case f.Tokens != 0 && f.Tokens != n:
		return h, 0, errorf(CodeShape, "send: Tokens says %d, Data holds %d", f.Tokens, n)
	case l.spec.Tokens > 0 && n != l.spec.Tokens:
		return h, 0, errorf(CodeShape, "send: %d tokens, the placement says %d per microbatch", n, l.spec.Tokens)
	case n > l.spec.MaxTokens:
		return h, 0, errorf(CodeShape, "send: %d tokens, at most %d per microbatch", n, l.spec.MaxTokens)
	case c.NeedsIDs(dir) && len(f.IDs) != n:
		return h, 0, errorf(CodeShape, "send: %s %s needs %d token ids, have %d", c.ID(), dir, n, len(f.IDs))
	}
	out, residual, err := c.Encode(l.plain[:0], dir, f.Data, f.IDs)
	if err != nil {
		return h, 0, codecError(err)
	}
	l.plain = out
	if f.Kind == KindForward && c.ID().Subspace() && l.spec.MaxResidual >= 0 && residual > l.spec.MaxResidual {
		return h, residual, errorf(CodeInvariant, "send: residual ‖(I−UUᵀ)(h−E_fix)‖/‖h−E_fix‖ = %.3g exceeds %.3g: the model has left span(U)", residual, l.spec.MaxResidual)
	}
	h.Codec, h.Rows, h.Cols, h.Length = c.ID(), uint32(n), uint32(c.Cols(dir)), uint64(len(l.plain))
	return h, residual, nil
}

func codecError(err error) error {
	switch {
	case errors.Is(err, codec.ErrNonFinite), errors.Is(err, codec.ErrTokenID):
		return wrapErr(CodeBadPayload, "", err)
	case errors.Is(err, codec.ErrShape):
		return wrapErr(CodeShape, "", err)
	}
	return wrapErr(CodeInternal, "", err)
}

func (l *Link) beforeWrite() error {
	now := time.Now()
	dl := now.Add(l.svc.cfg.ioTimeout)
	if cd, ok := l.sendCtx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	// Refresh the deadline only when it has moved by a quarter of the
	// timeout: one deadline per record would cost a timer reset each.
	if dl.Sub(l.sendDeadline) > l.svc.cfg.ioTimeout/4 || dl.Before(l.sendDeadline) {
		if err := l.s.SetWriteDeadline(dl); err != nil {
			return err
		}
		l.sendDeadline = dl
	}
	return l.sendCtx.Err()
}

func (l *Link) beforeRead(first bool) error {
	now := time.Now()
	timeout := l.svc.cfg.ioTimeout
	if first {
		timeout = l.svc.cfg.idleTimeout
	}
	dl := now.Add(timeout)
	if cd, ok := l.recvCtx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	if first || dl.Sub(l.recvDeadline) > timeout/4 || dl.Before(l.recvDeadline) {
		if err := l.s.SetReadDeadline(dl); err != nil {
			return err
		}
		l.recvDeadline = dl
	}
	return l.recvCtx.Err()
}

// Recv reads the next frame, checks it against the spec before reading its
// payload, and decodes it. A frame that breaks the spec ends the link: the
// peer is told why (an error frame, then a reset carrying the code), the
// refusal is logged, and Recv returns an *Error matching the code's
// sentinel (ErrShape, ErrStep, …). A peer's own refusal comes back as an
// *Error with Remote set. io.EOF means the peer closed cleanly between
// frames. A context that ends while no frame has started leaves the link
// open.
func (l *Link) Recv(ctx context.Context) (Frame, error) {
	l.recvMu.Lock()
	defer l.recvMu.Unlock()
	if err := l.Err(); err != nil {
		return Frame{}, err
	}
	if l.recvEOF {
		return Frame{}, io.EOF
	}
	before := l.r.read.Load()
	h, payload, err := l.read(ctx)
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Kind: h.Kind, Step: h.Step, Micro: h.Micro, Tokens: int(h.Rows)}
	switch h.Kind {
	case KindError:
		return Frame{}, l.remoteError(payload)
	case KindControl:
		f.Control = append([]byte(nil), payload...)
	default:
		c := l.spec.Codec
		dir := h.Kind.direction()
		f.Data = make([]float32, f.Tokens*c.Dim())
		if c.NeedsIDs(dir) {
			f.IDs = make([]int, f.Tokens)
		}
		if err := c.Decode(payload, dir, f.Tokens, f.Data, f.IDs); err != nil {
			return Frame{}, l.fail(codecError(err))
		}
	}
	l.mu.Lock()
	l.stats.FramesRecv++
	l.stats.TokensRecv += uint64(h.Rows)
	l.stats.PayloadRecv += int64(h.Length)
	if h.Kind == KindForward || h.Kind == KindBackward {
		// The reader takes whole frames' records (readFrame), so the
		// count moved by exactly this frame.
		l.stats.TensorBytesRecv += l.r.read.Load() - before
		l.stats.TensorTokensRecv += uint64(h.Rows)
	}
	l.mu.Unlock()
	return f, nil
}

// read reads and checks the next frame, returning its header and payload
// (valid until the next read); the caller holds recvMu.
func (l *Link) read(ctx context.Context) (header, []byte, error) {
	l.recvCtx = ctx
	stop := context.AfterFunc(ctx, func() { _ = l.s.SetReadDeadline(time.Unix(1, 0)) })
	before := l.r.read.Load()
	h, payload, err := l.r.readFrame(
		func(h *header) error { return l.spec.checkHeader(h, l.job, &l.window) },
		l.buffer)
	stop()
	if err == nil {
		return h, payload, nil
	}
	if l.r.read.Load() == before && !isRefusal(err) && (ctxErr(ctx) != nil || isTimeout(err)) {
		// Nothing of the next frame was consumed: the link is intact.
		if cerr := ctxErr(ctx); cerr != nil {
			return h, nil, cerr
		}
		return h, nil, wrapErr(CodeTimeout, "waiting for a frame", err)
	}
	if errors.Is(err, io.EOF) {
		// The peer sends no more; our side may still send.
		l.recvEOF = true
		return h, nil, io.EOF
	}
	if cerr := ctxErr(ctx); cerr != nil && !isRefusal(err) {
		return h, nil, l.abort(CodeTimeout, fmt.Errorf("wire: recv cancelled mid-frame: %w", cerr))
	}
	return h, nil, l.fail(err)
}

// ctxErr is ctx.Err(), also when the stream deadline taken from ctx fired
// a moment before ctx's own timer.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

func isRefusal(err error) bool {
	var we *Error
	return errors.As(err, &we)
}

func isTimeout(err error) bool {
	var to interface{ Timeout() bool }
	return errors.As(err, &to) && to.Timeout()
}

// buffer returns room for an n-byte payload, reserving any growth from the
// stream's resource scope first.
func (l *Link) buffer(n int) ([]byte, error) {
	if cap(l.payload) < n {
		grow := n - cap(l.payload)
		if l.svc.cfg.reserve {
			if err := l.s.Scope().ReserveMemory(grow, network.ReservationPriorityAlways); err != nil {
				return nil, wrapErr(CodeResource, fmt.Sprintf("reserving %d bytes for a %d-byte payload", grow, n), err)
			}
			l.mu.Lock()
			l.reserved += grow
			l.mu.Unlock()
		}
		l.payload = make([]byte, n)
	}
	return l.payload[:n], nil
}

// remoteError ends the link with the peer's stated reason.
func (l *Link) remoteError(p []byte) error {
	e := &Error{Code: CodeInternal, Remote: true, Peer: l.remote}
	if len(p) >= 2 {
		e.Code = Code(binary.BigEndian.Uint16(p))
		e.Detail = sanitize(p[2:])
	}
	if l.setErr(e) {
		l.log.Info("peer refused link", "code", uint16(e.Code), "reason", e.Detail)
	}
	l.finish(true, 0)
	return l.Err()
}

// sanitize makes peer-supplied text safe for logs.
func sanitize(b []byte) string {
	s := strings.ToValidUTF8(string(b), "?")
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// fail ends the link after a receive-side failure. A refusal of the
// peer's frame is reported to the peer and logged; a reset or refusal by
// the peer is returned as the peer's error.
func (l *Link) fail(err error) error {
	err = fromStreamError(err, l.remote)
	var we *Error
	switch {
	case errors.As(err, &we):
	case isTimeout(err):
		we = wrapErr(CodeTimeout, "peer stalled mid-frame", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		we = wrapErr(CodeMalformed, "frame cut short", err)
	}
	if we != nil && !we.Remote {
		if we.Peer == "" {
			we.Peer = l.remote
		}
		return l.refuse(we)
	}
	if !l.setErr(err) {
		return l.Err()
	}
	l.finish(true, codeOf(err))
	return err
}

// refuse tells the peer why its frame was refused and ends the link. The
// error frame is sent only if no Send is in progress; the reset code
// carries the reason either way.
func (l *Link) refuse(e *Error) error {
	if !l.setErr(e) {
		return l.Err()
	}
	l.log.Warn("refused frame; resetting link", "code", uint16(e.Code), "err", e.Error())
	select {
	case l.sendMu <- struct{}{}:
	default:
		l.finish(true, e.Code)
		return e
	}
	msg := e.Detail
	if e.Err != nil {
		if msg != "" {
			msg += ": "
		}
		msg += e.Err.Error()
	}
	if msg == "" {
		msg = e.Code.String()
	}
	if len(msg) > MaxErrorMessage {
		msg = msg[:MaxErrorMessage]
	}
	p := binary.BigEndian.AppendUint16(nil, uint16(e.Code))
	p = append(p, msg...)
	h := header{Version: ProtocolVersion, Kind: KindError, Job: l.job, Length: uint64(len(p))}
	l.sendCtx, l.sendDeadline = context.Background(), time.Time{}
	_ = l.s.SetWriteDeadline(time.Now().Add(l.svc.cfg.lingerTimeout))
	werr := l.w.writeFrame(&h, p)
	<-l.sendMu
	if werr != nil {
		l.finish(true, e.Code)
		return e
	}
	_ = l.s.CloseWrite()
	// Give the peer a moment to read the error frame before the reset
	// discards it: wait for its end of the stream, bounded in time and
	// bytes, off the caller's goroutine.
	l.svc.goLinger(func() {
		_ = l.s.SetReadDeadline(time.Now().Add(l.svc.cfg.lingerTimeout))
		stop := context.AfterFunc(l.svc.ctx, func() { _ = l.s.SetReadDeadline(time.Unix(1, 0)) })
		_, _ = io.CopyN(io.Discard, l.s, 1<<20)
		stop()
		l.finish(true, e.Code)
	})
	return e
}

// abort ends the link after a send-side failure.
func (l *Link) abort(c Code, err error) error {
	if !l.setErr(err) {
		return l.Err()
	}
	l.finish(true, c)
	return err
}

// finish releases the link's resources: reset (with a code) or close.
func (l *Link) finish(reset bool, c Code) {
	if reset {
		if c == 0 {
			_ = l.s.Reset()
		} else {
			_ = l.s.ResetWithError(streamCode(c))
		}
	} else {
		_ = l.s.Close()
	}
	l.mu.Lock()
	if l.reserved > 0 {
		l.s.Scope().ReleaseMemory(l.reserved)
		l.reserved = 0
	}
	l.mu.Unlock()
	l.svc.untrack(l)
}

// CloseSend says this node will send no more frames; the peer's Recv gets
// io.EOF after the last one. Recv keeps working.
func (l *Link) CloseSend() error {
	select {
	case l.sendMu <- struct{}{}:
	case <-time.After(l.svc.cfg.ioTimeout):
		return l.abort(CodeTimeout, errorf(CodeTimeout, "close: a send is still blocked"))
	}
	defer func() { <-l.sendMu }()
	if err := l.Err(); err != nil {
		return err
	}
	return l.s.CloseWrite()
}

// Close ends the link cleanly after any frame being sent. The peer sees
// io.EOF at a frame boundary.
func (l *Link) Close() error {
	select {
	case l.sendMu <- struct{}{}:
		defer func() { <-l.sendMu }()
	case <-time.After(l.svc.cfg.ioTimeout):
		return l.abort(CodeTimeout, errorf(CodeTimeout, "close: a send is still blocked"))
	}
	if !l.setErr(ErrClosed) {
		return nil
	}
	l.finish(false, 0)
	return nil
}

// shutdown resets the link because the service is closing.
func (l *Link) shutdown() {
	if l.setErr(&Error{Code: CodeShutdown, Peer: l.remote}) {
		l.finish(true, CodeShutdown)
	}
}
