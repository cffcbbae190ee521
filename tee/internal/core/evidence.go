package core

import (
	"encoding/binary"
	"fmt"
)

// Bounds on evidence, checked before anything is allocated.
const (
	// MaxEvidenceBytes caps a whole encoded Evidence. A TDX quote with its
	// PEM chain is ~5 KiB and an SNP report with ARK, ASK and VCEK ~5 KiB.
	MaxEvidenceBytes = 64 << 10
	MaxProviderBytes = 32
	MaxReportBytes   = 32 << 10
	MaxCerts         = 8
	MaxCertBytes     = 16 << 10
)

// EvidenceVersion is the encoding version written by Marshal. Decoders
// reject any other version.
const EvidenceVersion = 1

var evidenceMagic = [4]byte{'H', 'P', 'T', 'E'}

// Evidence is one provider's proof for a set of claims: the hardware report
// whose REPORT_DATA is ReportData(Claims), and the certificates a verifier
// needs to check it offline.
type Evidence struct {
	// Provider names the report format: "snp", "tdx" or "sim".
	Provider string
	// Report is the provider's signed report (SNP: the 0x4A0-byte
	// attestation report; TDX: the v4 quote; sim: the signed sim report).
	Report []byte
	// Certs are provider-specific endorsements (SNP: certificate-table
	// entries; TDX: none, the quote carries its PCK chain; sim: none).
	Certs [][]byte
	Claims
}

// Marshal encodes e (big-endian):
//
//	"HPTE" version:u8
//	provider:u8-len bytes   swarm:u16-len bytes   key:u16-len bytes
//	nonce:u8-len bytes      term:u64
//	report:u32-len bytes    certs:u8-count { u32-len bytes }
//
// It refuses evidence that UnmarshalEvidence would refuse.
func (e *Evidence) Marshal() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	n := e.size()
	if n > MaxEvidenceBytes {
		return nil, fmt.Errorf("%w: evidence is %d bytes, limit %d", ErrMalformed, n, MaxEvidenceBytes)
	}
	b := make([]byte, 0, n)
	b = append(b, evidenceMagic[:]...)
	b = append(b, EvidenceVersion)
	b = append(b, byte(len(e.Provider)))
	b = append(b, e.Provider...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Swarm)))
	b = append(b, e.Swarm...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.IdentityKey)))
	b = append(b, e.IdentityKey...)
	b = append(b, byte(len(e.Nonce)))
	b = append(b, e.Nonce...)
	b = binary.BigEndian.AppendUint64(b, e.Term)
	b = binary.BigEndian.AppendUint32(b, uint32(len(e.Report)))
	b = append(b, e.Report...)
	b = append(b, byte(len(e.Certs)))
	for _, c := range e.Certs {
		b = binary.BigEndian.AppendUint32(b, uint32(len(c)))
		b = append(b, c...)
	}
	return b, nil
}

func (e *Evidence) size() int {
	n := 4 + 1 + 1 + len(e.Provider) + 2 + len(e.Swarm) + 2 + len(e.IdentityKey) +
		1 + len(e.Nonce) + 8 + 4 + len(e.Report) + 1
	for _, c := range e.Certs {
		n += 4 + len(c)
	}
	return n
}

// Validate checks every bound UnmarshalEvidence checks; for evidence built in
// process rather than decoded.
func (e *Evidence) Validate() error {
	if e == nil {
		return fmt.Errorf("%w: nil evidence", ErrMalformed)
	}
	if err := validProvider(e.Provider); err != nil {
		return err
	}
	if err := e.Claims.Validate(); err != nil {
		return err
	}
	if len(e.Report) == 0 || len(e.Report) > MaxReportBytes {
		return fmt.Errorf("%w: report length %d not in 1..%d", ErrMalformed, len(e.Report), MaxReportBytes)
	}
	if len(e.Certs) > MaxCerts {
		return fmt.Errorf("%w: %d certificates, limit %d", ErrMalformed, len(e.Certs), MaxCerts)
	}
	for i, c := range e.Certs {
		if len(c) == 0 || len(c) > MaxCertBytes {
			return fmt.Errorf("%w: certificate %d length %d not in 1..%d", ErrMalformed, i, len(c), MaxCertBytes)
		}
	}
	return nil
}

// validProvider accepts short lower-case names so that a provider string is
// always safe to print in logs and status lines.
func validProvider(p string) error {
	if p == "" || len(p) > MaxProviderBytes {
		return fmt.Errorf("%w: provider name length %d not in 1..%d", ErrMalformed, len(p), MaxProviderBytes)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%w: provider name has byte 0x%02x", ErrMalformed, c)
		}
	}
	return nil
}

// decoder reads length-prefixed fields from a bounded buffer; the first
// error sticks and later reads return zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = fmt.Errorf("%w: %s needs %d bytes, %d left", ErrMalformed, what, n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint(size int, what string) uint64 {
	v := d.take(size, what)
	switch {
	case v == nil:
		return 0
	case size == 1:
		return uint64(v[0])
	case size == 2:
		return uint64(binary.BigEndian.Uint16(v))
	case size == 4:
		return uint64(binary.BigEndian.Uint32(v))
	default:
		return binary.BigEndian.Uint64(v)
	}
}

// field reads a length prefix of lenSize bytes, checks it against limit,
// then copies the field.
func (d *decoder) field(lenSize int, limit int, what string) []byte {
	n := d.uint(lenSize, what+" length")
	if d.err != nil {
		return nil
	}
	if n > uint64(limit) {
		d.err = fmt.Errorf("%w: %s length %d exceeds %d", ErrMalformed, what, n, limit)
		return nil
	}
	v := d.take(int(n), what)
	if v == nil {
		return nil
	}
	return append([]byte(nil), v...)
}

// UnmarshalEvidence decodes bytes written by Marshal. It checks the total
// size, every length prefix and every bound before allocating, rejects
// trailing bytes, and validates the claims. It does not verify anything:
// pass the result to a Verifier.
func UnmarshalEvidence(b []byte) (*Evidence, error) {
	if len(b) > MaxEvidenceBytes {
		return nil, fmt.Errorf("%w: evidence is %d bytes, limit %d", ErrMalformed, len(b), MaxEvidenceBytes)
	}
	d := &decoder{b: b}
	if m := d.take(4, "magic"); m != nil && [4]byte(m) != evidenceMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrMalformed, m)
	}
	if v := d.uint(1, "version"); d.err == nil && v != EvidenceVersion {
		return nil, fmt.Errorf("%w: encoding version %d, want %d", ErrMalformed, v, EvidenceVersion)
	}
	e := &Evidence{}
	e.Provider = string(d.field(1, MaxProviderBytes, "provider"))
	e.Swarm = string(d.field(2, MaxSwarmBytes, "swarm"))
	e.IdentityKey = d.field(2, MaxIdentityKeyBytes, "identity key")
	e.Nonce = d.field(1, MaxNonceBytes, "nonce")
	e.Term = d.uint(8, "term")
	e.Report = d.field(4, MaxReportBytes, "report")
	count := d.uint(1, "certificate count")
	if d.err == nil && count > MaxCerts {
		return nil, fmt.Errorf("%w: %d certificates, limit %d", ErrMalformed, count, MaxCerts)
	}
	for i := 0; d.err == nil && i < int(count); i++ {
		e.Certs = append(e.Certs, d.field(4, MaxCertBytes, fmt.Sprintf("certificate %d", i)))
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(d.b))
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e, nil
}
