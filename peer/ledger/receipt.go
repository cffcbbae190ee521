package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Version is the receipt format this package writes and reads.
const Version = 1

// Limits on a receipt. A decoder checks them before it trusts a field.
const (
	MaxReceiptBytes = 4096           // one encoded receipt (a gossip message, a line of the store)
	MaxPeriod       = 24 * time.Hour // one receipt covers at most a day
	MaxTokens       = int64(1) << 40 // per receipt: far beyond a day of any machine
	MaxSteps        = int64(1) << 32 // steps one receipt may cover
	maxIDLen        = 128            // a peer id's text form
	maxJobLen       = 128            // job ids are short
	maxSwarmLen     = 64             // as peer.ValidateSwarmName allows
	sigSlack        = 1.0            // seconds of rounding allowed when comparing durations
	domain          = "holopeer/ledger/receipt/v1"
	maxSigLen       = 128  // an Ed25519 signature is 64 bytes
	minYear         = 2000 // times outside [minYear, maxYear) are malformed
	maxYear         = 2200 // UnixNano overflows in 2262
)

// Errors Verify and Store report. Check them with errors.Is.
var (
	ErrMalformed      = errors.New("malformed receipt")
	ErrBadSignature   = errors.New("bad signature (forged or tampered receipt)")
	ErrOtherSwarm     = errors.New("receipt for another swarm")
	ErrUnknownTerm    = errors.New("term not in the coordinator history")
	ErrNotCoordinator = errors.New("signer was not the coordinator of that term")
	ErrDuplicate      = errors.New("duplicate receipt")
	ErrOverlap        = errors.New("overlaps a receipt already counted")
)

// Receipt credits one peer for one interval. JobID is empty for a receipt
// of presence alone; then the step range, ComputeS and Tokens are zero.
// A coordinator puts a peer's presence for an interval in at most one
// receipt (the other receipts of that interval carry PresenceS 0); Verify
// rejects presence counted twice for the same time.
type Receipt struct {
	Version     int       `json:"v"`
	Swarm       string    `json:"swarm"`
	Term        uint64    `json:"term"`
	Coordinator string    `json:"coordinator"` // the signer's peer id
	Peer        string    `json:"peer"`        // who is credited
	JobID       string    `json:"job,omitempty"`
	FromStep    int64     `json:"from_step"` // job steps [FromStep, ToStep)
	ToStep      int64     `json:"to_step"`
	PeriodStart time.Time `json:"period_start"` // wall-clock interval [PeriodStart, PeriodEnd)
	PeriodEnd   time.Time `json:"period_end"`
	PresenceS   float64   `json:"presence_s"` // seconds on offer to the swarm within the period
	ComputeS    float64   `json:"compute_s"`  // seconds busy with the job's work within the period
	Tokens      int64     `json:"tokens"`     // tokens the peer processed for the job
	IssuedAt    time.Time `json:"issued_at"`
	Sig         []byte    `json:"sig"`
}

// Hash identifies a receipt by its signed content (not its signature).
type Hash [sha256.Size]byte

func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Short is the first 12 hex digits, for tables.
func (h Hash) Short() string { return h.String()[:12] }

// Hash is the SHA-256 of the receipt's signed bytes.
func (r Receipt) Hash() Hash { return sha256.Sum256(r.signedBytes()) }

// Points is what a receipt is worth: 1 point per hour present, 1 per
// minute computing, 1 per 10,000 tokens (see the package comment).
func Points(r Receipt) float64 {
	return r.PresenceS/PresenceSecondsPerPoint + r.ComputeS/ComputeSecondsPerPoint + float64(r.Tokens)/TokensPerPoint
}

// The points formula's constants.
const (
	PresenceSecondsPerPoint = 3600.0
	ComputeSecondsPerPoint  = 60.0
	TokensPerPoint          = 10000.0
)

// signedBytes is the canonical encoding the signature covers: the domain
// prefix, then every field in a fixed order, strings length-prefixed,
// numbers big-endian, floats as IEEE bits, times as Unix nanoseconds.
func (r Receipt) signedBytes() []byte {
	b := make([]byte, 0, 256)
	b = appendString(b, domain)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Version))
	b = appendString(b, r.Swarm)
	b = binary.BigEndian.AppendUint64(b, r.Term)
	b = appendString(b, r.Coordinator)
	b = appendString(b, r.Peer)
	b = appendString(b, r.JobID)
	b = binary.BigEndian.AppendUint64(b, uint64(r.FromStep))
	b = binary.BigEndian.AppendUint64(b, uint64(r.ToStep))
	b = binary.BigEndian.AppendUint64(b, uint64(r.PeriodStart.UnixNano()))
	b = binary.BigEndian.AppendUint64(b, uint64(r.PeriodEnd.UnixNano()))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.PresenceS))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.ComputeS))
	b = binary.BigEndian.AppendUint64(b, uint64(r.Tokens))
	b = binary.BigEndian.AppendUint64(b, uint64(r.IssuedAt.UnixNano()))
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Sign fills in Version and Coordinator (the key's peer id), checks the
// receipt and signs it with the coordinator's identity key.
func Sign(r Receipt, key crypto.PrivKey) (Receipt, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return Receipt{}, fmt.Errorf("ledger: sign: %w", err)
	}
	if r.Coordinator != "" && r.Coordinator != id.String() {
		return Receipt{}, fmt.Errorf("ledger: sign: receipt names coordinator %s but the key is %s", r.Coordinator, id)
	}
	r.Version = Version
	r.Coordinator = id.String()
	r.Sig = nil
	if err := r.Validate(); err != nil {
		return Receipt{}, err
	}
	if r.Sig, err = key.Sign(r.signedBytes()); err != nil {
		return Receipt{}, fmt.Errorf("ledger: sign: %w", err)
	}
	return r, nil
}

// CheckSignature checks that the receipt's coordinator signed exactly
// these fields. It does not check that the signer was coordinator.
func (r Receipt) CheckSignature() error {
	id, err := peer.Decode(r.Coordinator)
	if err != nil {
		return fmt.Errorf("%w: coordinator %q is not a peer id", ErrMalformed, r.Coordinator)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("%w: coordinator %s has no inline public key: %v", ErrMalformed, r.Coordinator, err)
	}
	ok, err := pub.Verify(r.signedBytes(), r.Sig)
	if err != nil || !ok {
		return ErrBadSignature
	}
	return nil
}

// Validate checks every field's range and shape (not the signature).
func (r Receipt) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	if r.Version != Version {
		return bad("version %d, want %d", r.Version, Version)
	}
	if r.Swarm == "" || len(r.Swarm) > maxSwarmLen || !printable(r.Swarm) {
		return bad("swarm %q", clip(r.Swarm))
	}
	if r.Term == 0 {
		return bad("term 0")
	}
	for _, f := range []struct{ name, v string }{{"coordinator", r.Coordinator}, {"peer", r.Peer}} {
		if len(f.v) == 0 || len(f.v) > maxIDLen {
			return bad("%s id of %d bytes", f.name, len(f.v))
		}
		if _, err := peer.Decode(f.v); err != nil {
			return bad("%s %q is not a peer id", f.name, clip(f.v))
		}
	}
	if len(r.JobID) > maxJobLen || !printable(r.JobID) {
		return bad("job id %q", clip(r.JobID))
	}
	for _, t := range []struct {
		name string
		v    time.Time
	}{{"period_start", r.PeriodStart}, {"period_end", r.PeriodEnd}, {"issued_at", r.IssuedAt}} {
		if y := t.v.Year(); y < minYear || y >= maxYear {
			return bad("%s %s is out of range", t.name, t.v.Format(time.RFC3339))
		}
	}
	period := r.PeriodEnd.Sub(r.PeriodStart)
	if period <= 0 || period > MaxPeriod {
		return bad("period of %s (want (0, %s])", period, MaxPeriod)
	}
	if r.IssuedAt.Before(r.PeriodStart) {
		return bad("issued before its period started")
	}
	secs := period.Seconds() + sigSlack
	for _, f := range []struct {
		name string
		v    float64
	}{{"presence_s", r.PresenceS}, {"compute_s", r.ComputeS}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 || math.Signbit(f.v) {
			return bad("%s %v", f.name, f.v)
		}
		if f.v > secs {
			return bad("%s %.1f exceeds the %.1f s period", f.name, f.v, period.Seconds())
		}
	}
	if r.Tokens < 0 || r.Tokens > MaxTokens {
		return bad("tokens %d", r.Tokens)
	}
	if r.JobID == "" {
		if r.FromStep != 0 || r.ToStep != 0 || r.ComputeS != 0 || r.Tokens != 0 {
			return bad("a presence receipt (no job) carries steps, compute or tokens")
		}
		if r.PresenceS == 0 {
			return bad("a presence receipt with no presence")
		}
	} else if r.FromStep < 0 || r.ToStep <= r.FromStep || r.ToStep-r.FromStep > MaxSteps {
		return bad("steps [%d, %d)", r.FromStep, r.ToStep)
	}
	if len(r.Sig) > maxSigLen {
		return bad("signature of %d bytes", len(r.Sig))
	}
	return nil
}

// printable reports whether s is plain printable ASCII, so ids never carry
// control characters into a terminal or a page.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Encode is the receipt's wire and storage form: one line of JSON, no
// trailing newline.
func (r Receipt) Encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("ledger: encode: %w", err)
	}
	if len(b) > MaxReceiptBytes {
		return nil, fmt.Errorf("%w: encoded receipt is %d bytes, over %d", ErrMalformed, len(b), MaxReceiptBytes)
	}
	return b, nil
}

// DecodeReceipt parses one encoded receipt from untrusted bytes (gossip, a
// file) and checks its fields. It does not check the signature.
func DecodeReceipt(b []byte) (Receipt, error) {
	var r Receipt
	if err := decodeStrict(b, MaxReceiptBytes, &r); err != nil {
		return Receipt{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := r.Validate(); err != nil {
		return Receipt{}, err
	}
	return r, nil
}

// decodeStrict decodes exactly one JSON value of at most max bytes with no
// unknown fields (a field the signature does not cover must not ride
// along).
func decodeStrict(b []byte, max int, v any) error {
	if len(b) > max {
		return fmt.Errorf("%d bytes, over the %d-byte limit", len(b), max)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
