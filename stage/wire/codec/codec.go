// Package codec turns the tensors that cross a stage boundary into payload
// bytes and back: activations (n tokens × d_model) forward and activation
// gradients (n × d_model) backward.
//
// The codec is a property of the job (the manifest names it), so every
// stage of a job uses the same one and the handshake checks that both ends
// agree by comparing Fingerprints. A codec is immutable and safe for
// concurrent use; it holds no per-call state.
//
// Decoders treat their input as hostile: the caller has already checked the
// payload length against PayloadSize, and Decode still rejects non-finite
// values and token ids outside the vocabulary, so nothing a peer sends can
// make the next stage compute on NaNs or index past E_fix.
package codec

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/holopeer/holopeer/stage/subspace"
)

// ID names a codec on the wire and in manifests.
//
// WARNING: ONLY APPEND TO THIS LIST! The values are carried in frame
// headers; changing one breaks every peer that speaks the old protocol.
type ID uint8

const (
	// None is the codec byte of frames that carry no tensor (control,
	// error).
	None ID = 0
	// FP32: n×d little-endian IEEE float32. Layout per token: d × 4 bytes.
	FP32 ID = 1
	// BF16: n×d bfloat16, rounded to nearest even. Layout per token:
	// d × 2 bytes (the high half of the float32, little-endian).
	BF16 ID = 2
	// Int8Block: blockwise absmax int8, the Petals-style fallback for
	// models not trained under the subspace constraint. Layout per token:
	// ⌈d/64⌉ × float32 scales (absmax/127 of each 64-value block), then
	// d × int8.
	Int8Block ID = 3
	// SubspaceFP32: Protocol Models coefficients in float32. Forward layout:
	// n token ids (idWidth bytes each, little-endian) then n×k float32
	// coefficients of (h − E_fix[id])·U. Backward layout: n×k float32 of G·U.
	SubspaceFP32 ID = 4
	// SubspaceBF16: as SubspaceFP32 with bfloat16 coefficients.
	SubspaceBF16 ID = 5
)

// Int8BlockSize is the number of values that share one scale in Int8Block.
const Int8BlockSize = 64

var names = map[ID]string{
	FP32:         "fp32",
	BF16:         "bf16",
	Int8Block:    "int8",
	SubspaceFP32: "subspace-fp32",
	SubspaceBF16: "subspace-bf16",
}

func (id ID) String() string {
	if s, ok := names[id]; ok {
		return s
	}
	if id == None {
		return "none"
	}
	return fmt.Sprintf("codec(%d)", uint8(id))
}

// Known reports whether id names a tensor codec this version implements.
func (id ID) Known() bool { _, ok := names[id]; return ok }

// Subspace reports whether id is one of the subspace codecs, which need a
// basis.
func (id ID) Subspace() bool { return id == SubspaceFP32 || id == SubspaceBF16 }

// ParseID reads a codec name as written in a manifest. "subspace" alone
// means subspace-bf16, the default coefficient precision.
func ParseID(s string) (ID, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "subspace" {
		return SubspaceBF16, nil
	}
	for id, n := range names {
		if n == s {
			return id, nil
		}
	}
	return None, fmt.Errorf("codec: unknown codec %q (want fp32, bf16, int8, subspace, subspace-bf16 or subspace-fp32)", s)
}

// Direction is the way a tensor travels: activations go forward, their
// gradients backward. Some codecs encode the two differently.
type Direction uint8

const (
	Forward  Direction = 1
	Backward Direction = 2
)

func (d Direction) String() string {
	switch d {
	case Forward:
		return "forward"
	case Backward:
		return "backward"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// Errors a Decode or Encode returns; callers map them to wire error codes.
var (
	ErrShape     = errors.New("codec: shape mismatch")
	ErrNonFinite = errors.New("codec: non-finite value")
	ErrTokenID   = errors.New("codec: token id outside vocabulary")
	ErrDirection = errors.New("codec: unknown direction")
)

// Codec encodes n tokens' d-dimensional vectors for one direction.
type Codec interface {
	ID() ID
	// Dim is d_model: the caller always hands in and gets back n×Dim
	// float32s, whatever travels on the wire.
	Dim() int
	// Cols is the number of values per token on the wire: Dim, or the
	// rank k for subspace codecs.
	Cols(dir Direction) int
	// NeedsIDs reports whether dir carries token ids (subspace forward).
	NeedsIDs(dir Direction) bool
	// PayloadSize is the exact payload length of n tokens.
	PayloadSize(dir Direction, n int) int
	// Encode appends the payload of the n = len(x)/Dim tokens in x to dst.
	// ids must have n entries when NeedsIDs(dir). residual is the relative
	// norm of the part of the activation the codec could not carry (the
	// subspace invariant monitor); it is 0 for codecs that carry
	// everything up to rounding.
	Encode(dst []byte, dir Direction, x []float32, ids []int) (out []byte, residual float64, err error)
	// Decode fills x (n×Dim) and, when NeedsIDs(dir), ids (n) from a
	// payload of exactly PayloadSize(dir, n) bytes.
	Decode(src []byte, dir Direction, n int, x []float32, ids []int) error
	// Fingerprint commits to everything both ends must share: the codec,
	// d, and for subspace codecs k, the id width and the basis hash.
	Fingerprint() [32]byte
}

// Params are what a codec needs besides its ID.
//
// Create one codec per job and share it between the job's links: a
// subspace codec keeps a cache of E_fix rows.
type Params struct {
	Dim   int             // d_model; must equal Basis.Dim() for subspace codecs
	Basis *subspace.Basis // required by subspace codecs, ignored by others
	// EFixCacheBytes bounds the subspace codec's cache of E_fix rows; 0
	// means DefaultEFixCacheBytes, negative turns the cache off.
	EFixCacheBytes int
}

// MaxDim bounds d_model for every codec (the subspace package's bound).
const MaxDim = subspace.MaxDim

// New returns the codec id for p.
func New(id ID, p Params) (Codec, error) {
	if p.Dim <= 0 || p.Dim > MaxDim {
		return nil, fmt.Errorf("codec %s: dim %d out of range 1..%d", id, p.Dim, MaxDim)
	}
	switch id {
	case FP32, BF16:
		return dense{id: id, d: p.Dim}, nil
	case Int8Block:
		return int8Block{d: p.Dim}, nil
	case SubspaceFP32, SubspaceBF16:
		if p.Basis == nil {
			return nil, fmt.Errorf("codec %s: needs the job's subspace basis", id)
		}
		if p.Basis.Dim() != p.Dim {
			return nil, fmt.Errorf("codec %s: basis dim %d, want %d", id, p.Basis.Dim(), p.Dim)
		}
		cache := p.EFixCacheBytes
		if cache == 0 {
			cache = DefaultEFixCacheBytes
		}
		return newSubspace(id, p.Basis, cache), nil
	}
	return nil, fmt.Errorf("codec: unknown codec %s", id)
}

func fingerprint(id ID, fields ...uint64) [32]byte {
	h := sha256.New()
	h.Write([]byte("holopeer/codec/1"))
	h.Write([]byte{byte(id)})
	var b [8]byte
	for _, f := range fields {
		binary.LittleEndian.PutUint64(b[:], f)
		h.Write(b[:])
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func checkDir(dir Direction) error {
	if dir != Forward && dir != Backward {
		return fmt.Errorf("%w %d", ErrDirection, dir)
	}
	return nil
}

// tokens returns n = len(x)/d after checking that x is whole rows.
func tokens(x []float32, d int) (int, error) {
	if len(x)%d != 0 {
		return 0, fmt.Errorf("%w: %d values are not whole rows of %d", ErrShape, len(x), d)
	}
	return len(x) / d, nil
}

func grow(dst []byte, n int) ([]byte, []byte) {
	l := len(dst)
	if cap(dst)-l < n {
		nd := make([]byte, l, l+n)
		copy(nd, dst)
		dst = nd
	}
	dst = dst[:l+n]
	return dst, dst[l:]
}
