package wire

import (
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Code says why a link was refused or reset. It travels in error frames and
// as the libp2p stream reset code (streamCodeBase + Code), so a peer learns
// the reason even when the error frame cannot be delivered.
//
// WARNING: ONLY APPEND TO THIS LIST! Codes are seen by other versions.
type Code uint16

const (
	CodeInternal       Code = 1  // a bug or local I/O failure
	CodeShutdown       Code = 2  // the node is closing the service
	CodeNotAuthorized  Code = 3  // the remote is not in the job's placement
	CodeHandshake      Code = 4  // malformed handshake, bad signature, identity mismatch
	CodeSpecMismatch   Code = 5  // codec or subspace basis fingerprints differ
	CodeMalformed      Code = 6  // unparsable header, bad version, unknown codec
	CodeUnexpectedKind Code = 7  // a kind this link does not accept, or an unknown kind
	CodeShape          Code = 8  // rows, cols, codec or length differ from the spec
	CodeStep           Code = 9  // step or microbatch outside the window
	CodeTooLarge       Code = 10 // a length past a hard limit
	CodeDecrypt        Code = 11 // a record failed authentication: tampering or garbage
	CodeBadPayload     Code = 12 // non-finite values or token ids outside the vocabulary
	CodeResource       Code = 13 // the resource manager refused the memory
	CodeTimeout        Code = 14 // a read or write deadline passed
	CodeBusy           Code = 15 // the accept backlog is full
	CodeInvariant      Code = 16 // the sender's subspace residual is too large to send
)

// Sentinels for errors.Is; every *Error matches the sentinel of its Code,
// whether it was raised here or reported by the peer.
var (
	ErrInternal       = errors.New("wire: internal error")
	ErrShutdown       = errors.New("wire: service shutting down")
	ErrNotAuthorized  = errors.New("wire: peer not in the job's placement")
	ErrHandshake      = errors.New("wire: handshake failed")
	ErrSpecMismatch   = errors.New("wire: codec or subspace basis differs between the stages")
	ErrMalformed      = errors.New("wire: malformed frame")
	ErrUnexpectedKind = errors.New("wire: unexpected frame kind")
	ErrShape          = errors.New("wire: frame shape does not match the link spec")
	ErrStep           = errors.New("wire: step or microbatch outside the window")
	ErrTooLarge       = errors.New("wire: length exceeds limit")
	ErrDecrypt        = errors.New("wire: record failed authentication")
	ErrBadPayload     = errors.New("wire: payload values refused")
	ErrResource       = errors.New("wire: resource limit")
	ErrTimeout        = errors.New("wire: deadline exceeded")
	ErrBusy           = errors.New("wire: accept backlog full")
	ErrInvariant      = errors.New("wire: subspace invariant residual too large")
	// ErrClosed is returned by operations on a closed Link or Service.
	ErrClosed = errors.New("wire: closed")
)

var codeSentinel = map[Code]error{
	CodeInternal: ErrInternal, CodeShutdown: ErrShutdown, CodeNotAuthorized: ErrNotAuthorized,
	CodeHandshake: ErrHandshake, CodeSpecMismatch: ErrSpecMismatch, CodeMalformed: ErrMalformed,
	CodeUnexpectedKind: ErrUnexpectedKind, CodeShape: ErrShape, CodeStep: ErrStep,
	CodeTooLarge: ErrTooLarge, CodeDecrypt: ErrDecrypt, CodeBadPayload: ErrBadPayload,
	CodeResource: ErrResource, CodeTimeout: ErrTimeout, CodeBusy: ErrBusy, CodeInvariant: ErrInvariant,
}

func (c Code) String() string {
	if s, ok := codeSentinel[c]; ok {
		return s.Error()[len("wire: "):]
	}
	return fmt.Sprintf("code %d", uint16(c))
}

// streamCodeBase puts holopeer's codes in their own range of libp2p stream
// error codes ("HP" in the top bytes), clear of libp2p's 0x1000 block.
const streamCodeBase network.StreamErrorCode = 0x4850_0000

func streamCode(c Code) network.StreamErrorCode { return streamCodeBase | network.StreamErrorCode(c) }

// Error is a refusal: a frame or handshake this node rejected (Remote
// false), or one the peer rejected and reported (Remote true).
type Error struct {
	Code   Code
	Remote bool    // the peer reported it
	Peer   peer.ID // the other end, when known
	Detail string  // what was wrong, for logs
	Err    error   // the underlying cause, if any
}

func (e *Error) Error() string {
	who := "refused"
	if e.Remote {
		who = "peer refused"
	}
	s := "wire: " + who
	if e.Peer != "" {
		if e.Remote {
			s = fmt.Sprintf("wire: peer %s refused", e.Peer.ShortString())
		} else {
			s = fmt.Sprintf("wire: refused peer %s", e.Peer.ShortString())
		}
	}
	s += ": " + e.Code.String()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches the sentinel of the error's code.
func (e *Error) Is(target error) bool { return codeSentinel[e.Code] == target }

func (e *Error) Unwrap() error { return e.Err }

func errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Detail: fmt.Sprintf(format, args...)}
}

func wrapErr(c Code, detail string, err error) *Error {
	return &Error{Code: c, Detail: detail, Err: err}
}

// fromStreamError turns a stream reset that carries one of our codes into
// a remote *Error; other errors pass through.
func fromStreamError(err error, remote peer.ID) error {
	var se *network.StreamError
	if errors.As(err, &se) && se.Remote && se.ErrorCode&0xffff_0000 == streamCodeBase {
		return &Error{Code: Code(se.ErrorCode & 0xffff), Remote: true, Peer: remote, Err: err}
	}
	return err
}

// codeOf picks the code to report for a local failure.
func codeOf(err error) Code {
	var we *Error
	if errors.As(err, &we) && !we.Remote {
		return we.Code
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return CodeTimeout
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return CodeMalformed // a frame or handshake cut short
	}
	return CodeInternal
}
