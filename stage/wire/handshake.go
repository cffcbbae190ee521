package wire

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/flynn/noise"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Handshake flow on a fresh /holopeer/stage/1.0.0 stream:
//
//	I → R  preamble: u8 ProtocolVersion, [16] job            (cleartext)
//	       R asks its Authorizer whether I belongs to the job; if not it
//	       resets with CodeNotAuthorized before any key is exchanged.
//	I → R  record(XX message 1: e)
//	R → I  record(XX message 2: e, ee, s, es; payload_R)
//	I → R  record(XX message 3: s, se; payload_I)
//
// A record here is a 2-byte big-endian length and a Noise handshake
// message. The prologue binds both libp2p peer ids and the job, so a relay
// that splices two streams together, or a peer that replays another job's
// handshake, fails the handshake. Each payload proves that the sender's
// libp2p identity key owns the Noise static key it just used and carries
// the fingerprint of its codec (for subspace: the basis hash), which must
// equal ours.

// cipherSuite is Noise_XX_25519_ChaChaPoly_SHA256.
var cipherSuite = noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashSHA256)

// staticSigPrefix separates the static-key signature from anything else an
// identity key signs.
const staticSigPrefix = "holopeer-stage-noise-static:"

const preambleSize = 1 + 16

// Bounds on the handshake payload's variable fields.
const (
	maxIdentityKey = 1024 // Ed25519 is 36 bytes marshalled, RSA-4096 about 550
	maxSignature   = 1024
)

// handshakePayload is what each side sends inside its Noise message.
//
// Layout (big-endian):
//
//	0  u8   version (ProtocolVersion)
//	1  u8   flags, 0 (reserved: TEE evidence will be signalled here)
//	2  u16  K, length of the identity key (1..maxIdentityKey)
//	4  K    libp2p public key, crypto.MarshalPublicKey form
//	.  u16  S, length of the signature (1..maxSignature)
//	.  S    signature by that key over staticSigPrefix ‖ Noise static key
//	.  32   codec fingerprint
//
// Nothing may follow.
type handshakePayload struct {
	IdentityKey []byte
	Signature   []byte
	Fingerprint [32]byte
}

func (p *handshakePayload) marshal() []byte {
	b := make([]byte, 0, 2+2+len(p.IdentityKey)+2+len(p.Signature)+32)
	b = append(b, ProtocolVersion, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(p.IdentityKey)))
	b = append(b, p.IdentityKey...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(p.Signature)))
	b = append(b, p.Signature...)
	return append(b, p.Fingerprint[:]...)
}

func unmarshalHandshakePayload(b []byte) (handshakePayload, error) {
	var p handshakePayload
	bad := func(format string, args ...any) (handshakePayload, error) {
		return handshakePayload{}, errorf(CodeHandshake, "handshake payload: "+format, args...)
	}
	if len(b) < 4 {
		return bad("%d bytes is too short", len(b))
	}
	if b[0] != ProtocolVersion {
		return bad("version %d, this node speaks %d", b[0], ProtocolVersion)
	}
	if b[1] != 0 {
		return bad("unknown flags %#x", b[1])
	}
	k := int(binary.BigEndian.Uint16(b[2:]))
	if k == 0 || k > maxIdentityKey {
		return bad("identity key length %d outside 1..%d", k, maxIdentityKey)
	}
	b = b[4:]
	if len(b) < k+2 {
		return bad("truncated identity key")
	}
	p.IdentityKey = bytes.Clone(b[:k])
	b = b[k:]
	s := int(binary.BigEndian.Uint16(b))
	if s == 0 || s > maxSignature {
		return bad("signature length %d outside 1..%d", s, maxSignature)
	}
	b = b[2:]
	if len(b) != s+32 {
		return bad("%d bytes after the signature length, want %d", len(b), s+32)
	}
	p.Signature = bytes.Clone(b[:s])
	copy(p.Fingerprint[:], b[s:])
	return p, nil
}

// identity is what this node proves in every handshake: a Noise static
// key and its libp2p identity key's signature over it. It is made once per
// Service.
type identity struct {
	static    noise.DHKey
	pubKey    []byte
	signature []byte
}

func newIdentity(priv crypto.PrivKey, static *noise.DHKey) (*identity, error) {
	if priv == nil {
		return nil, errors.New("wire: the host has no private identity key")
	}
	id := &identity{}
	if static != nil {
		id.static = *static
	} else {
		k, err := cipherSuite.GenerateKeypair(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("wire: noise static key: %w", err)
		}
		id.static = k
	}
	pub, err := crypto.MarshalPublicKey(priv.GetPublic())
	if err != nil {
		return nil, fmt.Errorf("wire: marshal identity key: %w", err)
	}
	sig, err := priv.Sign(append([]byte(staticSigPrefix), id.static.Public...))
	if err != nil {
		return nil, fmt.Errorf("wire: sign noise static key: %w", err)
	}
	id.pubKey, id.signature = pub, sig
	return id, nil
}

func (id *identity) payload(fp [32]byte) []byte {
	p := handshakePayload{IdentityKey: id.pubKey, Signature: id.signature, Fingerprint: fp}
	return p.marshal()
}

// verifyPeer checks a remote handshake payload: the identity key must be
// the remote peer's, it must have signed the static key the peer used in
// this handshake, and the codec fingerprints must agree.
func verifyPeer(raw []byte, remote peer.ID, remoteStatic []byte, fp [32]byte) error {
	p, err := unmarshalHandshakePayload(raw)
	if err != nil {
		return err
	}
	pub, err := crypto.UnmarshalPublicKey(p.IdentityKey)
	if err != nil {
		return wrapErr(CodeHandshake, "identity key", err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return wrapErr(CodeHandshake, "identity key", err)
	}
	if id != remote {
		return errorf(CodeHandshake, "identity key belongs to %s, the stream's peer is %s", id.ShortString(), remote.ShortString())
	}
	ok, err := pub.Verify(append([]byte(staticSigPrefix), remoteStatic...), p.Signature)
	if err != nil || !ok {
		return &Error{Code: CodeHandshake, Detail: "static key not signed by the peer's identity key", Err: err}
	}
	if p.Fingerprint != fp {
		return errorf(CodeSpecMismatch, "peer's codec fingerprint %x, ours %x (different codec, d_model, rank, vocabulary or subspace seed)", p.Fingerprint[:6], fp[:6])
	}
	return nil
}

func prologue(initiator, responder peer.ID, job JobID) []byte {
	b := []byte("holopeer-stage/1\x00")
	for _, p := range []peer.ID{initiator, responder} {
		b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
		b = append(b, p...)
	}
	return append(b, job[:]...)
}

func writeHandshakeRecord(w io.Writer, pre, msg []byte) error {
	b := make([]byte, 0, len(pre)+recordPrefix+len(msg))
	b = append(b, pre...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	_, err := w.Write(append(b, msg...))
	return err
}

func readHandshakeRecord(r io.Reader) ([]byte, error) {
	var lb [recordPrefix]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	l := int(binary.BigEndian.Uint16(lb[:]))
	if l < 32 { // every XX message starts with an ephemeral or sealed static key
		return nil, errorf(CodeHandshake, "handshake message of %d bytes", l)
	}
	msg := make([]byte, l)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// session is the outcome of a handshake: one cipher state per direction.
type session struct {
	send, recv *noise.CipherState
}

// handshake runs XX over rw. The initiator also writes the preamble; the
// responder's caller has already read it.
func handshake(rw io.ReadWriter, initiator bool, id *identity, local, remote peer.ID, job JobID, fp [32]byte) (session, error) {
	iPeer, rPeer := local, remote
	if !initiator {
		iPeer, rPeer = remote, local
	}
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite:   cipherSuite,
		Random:        rand.Reader,
		Pattern:       noise.HandshakeXX,
		Initiator:     initiator,
		Prologue:      prologue(iPeer, rPeer, job),
		StaticKeypair: id.static,
	})
	if err != nil {
		return session{}, fmt.Errorf("wire: handshake state: %w", err)
	}
	fail := func(step string, err error) (session, error) {
		var we *Error
		if errors.As(err, &we) {
			return session{}, err
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return session{}, fmt.Errorf("wire: handshake %s: %w", step, err)
		}
		var to interface{ Timeout() bool }
		if errors.As(err, &to) && to.Timeout() {
			return session{}, wrapErr(CodeTimeout, "handshake "+step, err)
		}
		if isNoiseErr(err) {
			return session{}, wrapErr(CodeHandshake, step, err)
		}
		return session{}, fmt.Errorf("wire: handshake %s: %w", step, err)
	}
	if initiator {
		msg, _, _, err := hs.WriteMessage(nil, nil)
		if err != nil {
			return fail("message 1", err)
		}
		pre := make([]byte, 0, preambleSize)
		pre = append(pre, ProtocolVersion)
		pre = append(pre, job[:]...)
		if err := writeHandshakeRecord(rw, pre, msg); err != nil {
			return fail("write message 1", err)
		}
		in, err := readHandshakeRecord(rw)
		if err != nil {
			return fail("read message 2", err)
		}
		payload, _, _, err := hs.ReadMessage(nil, in)
		if err != nil {
			return fail("message 2", noiseErr{err})
		}
		if err := verifyPeer(payload, remote, hs.PeerStatic(), fp); err != nil {
			return fail("message 2", err)
		}
		msg, cs0, cs1, err := hs.WriteMessage(nil, id.payload(fp))
		if err != nil {
			return fail("message 3", noiseErr{err})
		}
		if err := writeHandshakeRecord(rw, nil, msg); err != nil {
			return fail("write message 3", err)
		}
		return session{send: cs0, recv: cs1}, nil
	}
	in, err := readHandshakeRecord(rw)
	if err != nil {
		return fail("read message 1", err)
	}
	p1, _, _, err := hs.ReadMessage(nil, in)
	if err != nil {
		return fail("message 1", noiseErr{err})
	}
	if len(p1) != 0 {
		return fail("message 1", errorf(CodeHandshake, "message 1 carries a %d-byte payload, want none", len(p1)))
	}
	msg, _, _, err := hs.WriteMessage(nil, id.payload(fp))
	if err != nil {
		return fail("message 2", noiseErr{err}) // e.g. a low-order ephemeral key from the peer
	}
	if err := writeHandshakeRecord(rw, nil, msg); err != nil {
		return fail("write message 2", err)
	}
	in, err = readHandshakeRecord(rw)
	if err != nil {
		return fail("read message 3", err)
	}
	payload, cs0, cs1, err := hs.ReadMessage(nil, in)
	if err != nil {
		return fail("message 3", noiseErr{err})
	}
	if err := verifyPeer(payload, remote, hs.PeerStatic(), fp); err != nil {
		return fail("message 3", err)
	}
	return session{send: cs1, recv: cs0}, nil
}

// noiseErr marks a failure inside the Noise state machine (a bad tag, a
// wrong prologue, a malformed message) as opposed to an I/O error.
type noiseErr struct{ err error }

func (e noiseErr) Error() string { return "noise: " + e.err.Error() }
func (e noiseErr) Unwrap() error { return e.err }

func isNoiseErr(err error) bool {
	var ne noiseErr
	return errors.As(err, &ne)
}

// readPreamble reads the initiator's version and job.
func readPreamble(r io.Reader) (JobID, error) {
	var b [preambleSize]byte
	var job JobID
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return job, fmt.Errorf("wire: read preamble: %w", err)
	}
	if b[0] != ProtocolVersion {
		return job, errorf(CodeHandshake, "preamble version %d, this node speaks %d", b[0], ProtocolVersion)
	}
	copy(job[:], b[1:])
	return job, nil
}
