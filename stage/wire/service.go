package wire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/flynn/noise"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ServiceName is the resource-manager service the stage streams are
// accounted to.
const ServiceName = "holopeer.stage"

type config struct {
	log              *slog.Logger
	handshakeTimeout time.Duration
	ioTimeout        time.Duration
	idleTimeout      time.Duration
	lingerTimeout    time.Duration
	backlog          int
	reserve          bool
	static           *noise.DHKey
}

// Option configures a Service.
type Option func(*config) error

// WithLogger sets the logger (default slog.Default()); the service adds
// component=wire.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("wire: nil logger")
		}
		c.log = l
		return nil
	}
}

// WithHandshakeTimeout bounds the preamble and the three handshake
// messages together (default 20 s: three round trips on a slow relayed
// path, with room).
func WithHandshakeTimeout(d time.Duration) Option {
	return positive("handshake timeout", d, func(c *config) { c.handshakeTimeout = d })
}

// WithIOTimeout bounds each read of a record inside a frame and each write
// of a batch of records (default 30 s): a peer that stalls mid-frame is cut
// off after it.
func WithIOTimeout(d time.Duration) Option {
	return positive("io timeout", d, func(c *config) { c.ioTimeout = d })
}

// WithIdleTimeout bounds the wait for the start of the next frame when the
// caller's context has no earlier deadline (default 10 min: pipeline
// bubbles can be long, but a silent peer is not kept forever).
func WithIdleTimeout(d time.Duration) Option {
	return positive("idle timeout", d, func(c *config) { c.idleTimeout = d })
}

// WithLingerTimeout bounds how long a refused link waits for the peer to
// read the error frame before the reset (default 2 s).
func WithLingerTimeout(d time.Duration) Option {
	return positive("linger timeout", d, func(c *config) { c.lingerTimeout = d })
}

// WithBacklog sets how many handshaken incoming links may wait for Accept
// (default 16); more are refused with CodeBusy.
func WithBacklog(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("wire: backlog %d, want ≥ 1", n)
		}
		c.backlog = n
		return nil
	}
}

// WithoutMemoryReservation stops charging receive buffers to the libp2p
// resource manager (for hosts built with a null resource manager).
func WithoutMemoryReservation() Option {
	return func(c *config) error { c.reserve = false; return nil }
}

// WithNoiseStaticKey uses k as the Noise static key instead of a fresh one,
// for nodes that bind their key into TEE evidence.
func WithNoiseStaticKey(k noise.DHKey) Option {
	return func(c *config) error {
		if len(k.Private) != 32 || len(k.Public) != 32 {
			return errors.New("wire: noise static key must be a 32-byte X25519 key pair")
		}
		c.static = &k
		return nil
	}
}

func positive(what string, d time.Duration, set func(*config)) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("wire: %s %v, want > 0", what, d)
		}
		set(c)
		return nil
	}
}

// Service serves /holopeer/stage/1.0.0 on a host: it runs the handshake
// for incoming streams, hands authorised links to Accept, and opens links
// with OpenLink. Close unregisters the protocol, resets every link and
// waits for the service's goroutines.
type Service struct {
	// Static after NewService.
	h    host.Host
	auth Authorizer
	cfg  config
	id   *identity

	ctx      context.Context
	cancel   context.CancelFunc
	incoming chan *Link

	// mu guards the following fields and every wg.Add.
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
	links  map[*Link]struct{}
}

// NewService registers the stage protocol on h. auth decides, per job and
// remote peer, whether a link may exist and what it carries.
func NewService(h host.Host, auth Authorizer, opts ...Option) (*Service, error) {
	if h == nil || auth == nil {
		return nil, errors.New("wire: NewService needs a host and an authorizer")
	}
	cfg := config{
		handshakeTimeout: 20 * time.Second,
		ioTimeout:        30 * time.Second,
		idleTimeout:      10 * time.Minute,
		lingerTimeout:    2 * time.Second,
		backlog:          16,
		reserve:          true,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.log == nil {
		cfg.log = slog.Default()
	}
	cfg.log = cfg.log.With("component", "wire")
	id, err := newIdentity(h.Peerstore().PrivKey(h.ID()), cfg.static)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{h: h, auth: auth, cfg: cfg, id: id, ctx: ctx, cancel: cancel,
		incoming: make(chan *Link, cfg.backlog), links: map[*Link]struct{}{}}
	h.SetStreamHandler(ProtocolID, s.handle)
	return s, nil
}

// begin registers a goroutine; it fails once Close has started.
func (s *Service) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Service) track(l *Link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.links[l] = struct{}{}
	return true
}

func (s *Service) untrack(l *Link) {
	s.mu.Lock()
	delete(s.links, l)
	s.mu.Unlock()
}

// goLinger runs f on a service goroutine, or now if the service is closing.
func (s *Service) goLinger(f func()) {
	if !s.begin() {
		f()
		return
	}
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// handle runs the responder side of a new stream.
func (s *Service) handle(str network.Stream) {
	if !s.begin() {
		_ = str.ResetWithError(streamCode(CodeShutdown))
		return
	}
	defer s.wg.Done()
	remote := str.Conn().RemotePeer()
	log := s.cfg.log.With("peer", remote.ShortString(), "path", pathOf(str))
	l, err := s.accept(str)
	if err != nil {
		code := codeOf(err)
		log.Warn("refused incoming link", "code", uint16(code), "err", err)
		_ = str.ResetWithError(streamCode(code))
		return
	}
	if !s.track(l) {
		l.shutdown()
		return
	}
	select {
	case s.incoming <- l:
		log.Debug("accepted link", "job", l.job.String())
	default:
		_ = l.refuse(errorf(CodeBusy, "%d links already wait for Accept", s.cfg.backlog))
	}
}

func (s *Service) accept(str network.Stream) (*Link, error) {
	if err := str.Scope().SetService(ServiceName); err != nil {
		return nil, wrapErr(CodeResource, "attach stream to service", err)
	}
	_ = str.SetDeadline(time.Now().Add(s.cfg.handshakeTimeout))
	stop := context.AfterFunc(s.ctx, func() { _ = str.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	remote := str.Conn().RemotePeer()
	job, err := readPreamble(str)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.handshakeTimeout)
	defer cancel()
	spec, err := s.authorize(ctx, job, remote)
	if err != nil {
		return nil, err
	}
	sess, err := handshake(str, false, s.id, s.h.ID(), remote, job, spec.Codec.Fingerprint())
	if err != nil {
		return nil, fromStreamError(err, remote)
	}
	_ = str.SetDeadline(time.Time{})
	return newLink(s, str, job, spec, sess), nil
}

func (s *Service) authorize(ctx context.Context, job JobID, remote peer.ID) (LinkSpec, error) {
	spec, err := s.auth.Authorize(ctx, job, remote)
	if err != nil {
		return LinkSpec{}, &Error{Code: CodeNotAuthorized, Peer: remote, Detail: "job " + job.String(), Err: err}
	}
	spec, err = spec.withDefaults()
	if err != nil {
		return LinkSpec{}, wrapErr(CodeInternal, "link spec from the authorizer", err)
	}
	return spec, nil
}

// Accept returns the next authorised, handshaken incoming link.
func (s *Service) Accept(ctx context.Context) (*Link, error) {
	select {
	case l := <-s.incoming:
		return l, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.ctx.Done():
		return nil, ErrClosed
	}
}

// OpenLink opens the stage stream to remote for job, runs the handshake
// and returns the link. remote must be authorised for job by this node's
// Authorizer too. Relayed (limited) connections are used when they are
// the only path: the payload is end-to-end encrypted either way.
func (s *Service) OpenLink(ctx context.Context, remote peer.ID, job JobID) (*Link, error) {
	if !s.begin() {
		return nil, ErrClosed
	}
	defer s.wg.Done()
	spec, err := s.authorize(ctx, job, remote)
	if err != nil {
		return nil, err
	}
	str, err := s.h.NewStream(network.WithAllowLimitedConn(ctx, "holopeer stage link"), remote, ProtocolID)
	if err != nil {
		return nil, fmt.Errorf("wire: open stream to %s: %w", remote.ShortString(), err)
	}
	if err := str.Scope().SetService(ServiceName); err != nil {
		_ = str.ResetWithError(streamCode(CodeResource))
		return nil, wrapErr(CodeResource, "attach stream to service", err)
	}
	dl := time.Now().Add(s.cfg.handshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	_ = str.SetDeadline(dl)
	hctx, cancel := context.WithCancel(ctx)
	stopSvc := context.AfterFunc(s.ctx, cancel)
	stop := context.AfterFunc(hctx, func() { _ = str.SetDeadline(time.Unix(1, 0)) })
	sess, err := handshake(str, true, s.id, s.h.ID(), remote, job, spec.Codec.Fingerprint())
	stop()
	stopSvc()
	cancel()
	if err != nil {
		err = fromStreamError(err, remote)
		if ctx.Err() != nil {
			err = fmt.Errorf("wire: handshake with %s: %w", remote.ShortString(), ctx.Err())
		} else if s.ctx.Err() != nil {
			err = ErrClosed
		}
		var we *Error
		if errors.As(err, &we) && !we.Remote {
			we.Peer = remote
			s.cfg.log.Warn("refused outgoing link", "peer", remote.ShortString(), "code", uint16(we.Code), "err", err)
		}
		_ = str.ResetWithError(streamCode(codeOf(err)))
		return nil, err
	}
	_ = str.SetDeadline(time.Time{})
	l := newLink(s, str, job, spec, sess)
	if !s.track(l) {
		l.shutdown()
		return nil, ErrClosed
	}
	return l, nil
}

// Close unregisters the protocol, resets every open link with
// CodeShutdown and waits for the service's goroutines.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	links := make([]*Link, 0, len(s.links))
	for l := range s.links {
		links = append(links, l)
	}
	s.mu.Unlock()
	s.h.RemoveStreamHandler(ProtocolID)
	s.cancel()
	for _, l := range links {
		l.shutdown()
	}
	s.wg.Wait()
	for {
		select {
		case l := <-s.incoming:
			l.shutdown()
		default:
			return nil
		}
	}
}

func pathOf(str network.Stream) string {
	if str.Conn().Stat().Limited {
		return "relayed"
	}
	return "direct"
}
