package wire

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

// ProtocolID is the libp2p protocol of the stage data path.
const ProtocolID = "/holopeer/stage/1.0.0"

// ProtocolVersion is carried in the preamble, the handshake payload and
// every frame header. A peer refuses any version it does not speak.
//
// History:
//   - 1: Noise_XX_25519_ChaChaPoly_SHA256 inside the stream; identity-signed
//     static keys and codec fingerprints in the handshake payloads; 48-byte
//     frame header; payloads in 65519-byte records.
const ProtocolVersion = 1

// Sizes of the record layer. A record is a 2-byte big-endian length and
// that many bytes of Noise ciphertext; the ciphertext is the plaintext plus
// a 16-byte tag, so a record carries at most MaxRecordPlaintext bytes.
// flynn/noise does not enforce the Noise 65535-byte limit on transport
// messages; the record writer does.
const (
	MaxRecord          = 65535
	TagSize            = 16
	MaxRecordPlaintext = MaxRecord - TagSize // 65519
	recordPrefix       = 2
)

// HeaderSize is the fixed size of a frame header.
const HeaderSize = 48

// firstChunk is the payload that fits in a frame's first record, after the
// header.
const firstChunk = MaxRecordPlaintext - HeaderSize

// MaxFramePayload bounds any frame's payload whatever a spec allows:
// 256 MiB is 8192 tokens of fp32 at d_model 8192.
const MaxFramePayload = 256 << 20

// MaxControlPayload bounds a control frame, which carries scheduler
// messages, never tensors.
const MaxControlPayload = 4096

// MaxErrorMessage bounds the text of an error frame.
const MaxErrorMessage = 256

// Kind is a frame type.
//
// WARNING: ONLY APPEND TO THIS LIST! Kinds are carried in frame headers.
type Kind uint8

const (
	// KindForward carries activations: header with the codec, rows =
	// tokens, cols = the codec's forward columns, then the codec payload
	// (for subspace: the token ids, then the k coefficients per token).
	KindForward Kind = 1
	// KindBackward carries activation gradients: header as for forward,
	// then the codec's backward payload.
	KindBackward Kind = 2
	// KindControl carries an opaque scheduler message of at most
	// MaxControlPayload bytes: codec None, rows 0, cols 0.
	KindControl Kind = 3
	// KindError says why the sender is about to reset the stream: codec
	// None, rows 0, cols 0, then a 2-byte big-endian Code and at most
	// MaxErrorMessage bytes of UTF-8 text.
	KindError Kind = 4
)

func (k Kind) String() string {
	switch k {
	case KindForward:
		return "forward"
	case KindBackward:
		return "backward"
	case KindControl:
		return "control"
	case KindError:
		return "error"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// direction maps a tensor kind to the codec's direction.
func (k Kind) direction() codec.Direction {
	if k == KindBackward {
		return codec.Backward
	}
	return codec.Forward
}

// KindSet is a set of tensor kinds a link accepts.
type KindSet uint8

// Kinds builds a KindSet.
func Kinds(ks ...Kind) KindSet {
	var s KindSet
	for _, k := range ks {
		if k >= 1 && k <= 7 {
			s |= 1 << k
		}
	}
	return s
}

// Has reports whether k is in s.
func (s KindSet) Has(k Kind) bool { return k >= 1 && k <= 7 && s&(1<<k) != 0 }

// JobID names a job on the wire: the first 16 bytes of the manifest's hash
// are the intended source (JobIDFromHash).
type JobID [16]byte

// JobIDFromHash takes the first 16 bytes of a hash (at least 16 bytes).
func JobIDFromHash(h []byte) (JobID, error) {
	var j JobID
	if len(h) < len(j) {
		return j, fmt.Errorf("wire: job hash has %d bytes, need at least %d", len(h), len(j))
	}
	copy(j[:], h)
	return j, nil
}

// ParseJobID reads the 32-hex-digit form String writes.
func ParseJobID(s string) (JobID, error) {
	var j JobID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(j) {
		return j, fmt.Errorf("wire: job id %q is not %d hex bytes", s, len(j))
	}
	copy(j[:], b)
	return j, nil
}

func (j JobID) String() string { return hex.EncodeToString(j[:]) }

// header is a frame header.
//
// Layout (48 bytes, big-endian):
//
//	 0  u8   version (ProtocolVersion)
//	 1  u8   kind
//	 2  u8   codec (codec.None for control and error frames)
//	 3  u8   reserved, 0
//	 4  [16] job
//	20  u64  step
//	28  u32  microbatch
//	32  u32  rows: tokens in this microbatch
//	36  u32  cols: values per token on the wire (d_model, or k for subspace)
//	40  u64  payload length in bytes
type header struct {
	Version uint8
	Kind    Kind
	Codec   codec.ID
	Job     JobID
	Step    uint64
	Micro   uint32
	Rows    uint32
	Cols    uint32
	Length  uint64
}

func (h *header) encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0], b[1], b[2], b[3] = h.Version, byte(h.Kind), byte(h.Codec), 0
	copy(b[4:20], h.Job[:])
	binary.BigEndian.PutUint64(b[20:], h.Step)
	binary.BigEndian.PutUint32(b[28:], h.Micro)
	binary.BigEndian.PutUint32(b[32:], h.Rows)
	binary.BigEndian.PutUint32(b[36:], h.Cols)
	binary.BigEndian.PutUint64(b[40:], h.Length)
}

// decodeHeader parses a header and checks what can be checked without a
// spec: size, version, the reserved byte, a known kind, and the shape rules
// every kind obeys. The link then checks the header against its spec.
func decodeHeader(b []byte) (header, error) {
	var h header
	if len(b) < HeaderSize {
		return h, errorf(CodeMalformed, "frame header has %d bytes, want %d", len(b), HeaderSize)
	}
	h.Version, h.Kind, h.Codec = b[0], Kind(b[1]), codec.ID(b[2])
	copy(h.Job[:], b[4:20])
	h.Step = binary.BigEndian.Uint64(b[20:])
	h.Micro = binary.BigEndian.Uint32(b[28:])
	h.Rows = binary.BigEndian.Uint32(b[32:])
	h.Cols = binary.BigEndian.Uint32(b[36:])
	h.Length = binary.BigEndian.Uint64(b[40:])
	switch {
	case h.Version != ProtocolVersion:
		return h, errorf(CodeMalformed, "frame version %d, this node speaks %d", h.Version, ProtocolVersion)
	case b[3] != 0:
		return h, errorf(CodeMalformed, "reserved header byte is %#x", b[3])
	case h.Length > MaxFramePayload:
		return h, errorf(CodeTooLarge, "payload length %d exceeds the %d-byte frame limit", h.Length, MaxFramePayload)
	}
	switch h.Kind {
	case KindForward, KindBackward:
		if !h.Codec.Known() {
			return h, errorf(CodeMalformed, "unknown codec %s", h.Codec)
		}
		if h.Rows == 0 || h.Cols == 0 {
			return h, errorf(CodeShape, "%s frame of %d×%d values", h.Kind, h.Rows, h.Cols)
		}
	case KindControl, KindError:
		if h.Codec != codec.None || h.Rows != 0 || h.Cols != 0 {
			return h, errorf(CodeMalformed, "%s frame with codec %s and shape %d×%d", h.Kind, h.Codec, h.Rows, h.Cols)
		}
		limit := uint64(MaxControlPayload)
		if h.Kind == KindError {
			limit = 2 + MaxErrorMessage
		}
		if h.Length > limit {
			return h, errorf(CodeTooLarge, "%s payload of %d bytes exceeds %d", h.Kind, h.Length, limit)
		}
	default:
		return h, errorf(CodeUnexpectedKind, "unknown frame kind %d", uint8(h.Kind))
	}
	return h, nil
}
