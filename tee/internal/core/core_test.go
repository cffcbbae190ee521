package core

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func testClaims() Claims {
	return Claims{
		Swarm:       "testnet-alpha",
		IdentityKey: bytes.Repeat([]byte{0xAB}, 36),
		Nonce:       bytes.Repeat([]byte{0x01}, 32),
		Term:        7,
	}
}

// The binding is part of the wire protocol: a change must be deliberate.
func TestReportDataGolden(t *testing.T) {
	rd := ReportData(testClaims())
	// Computed independently: python3 hashlib.sha512 over the same bytes.
	const want = "bbcf66a802074d51c51aa8fe387c14fb20d57197aa0b866ffd68b70c0f4e594b3ed9aa665a2e834209738192ce8e1808998b04a8473d0f6c70cde5ac3b506efe"
	got := hex.EncodeToString(rd[:])
	if got != want {
		t.Fatalf("ReportData changed:\n got %s\nwant %s", got, want)
	}
}

func TestReportDataSeparatesFields(t *testing.T) {
	base := testClaims()
	variants := map[string]Claims{}
	c := base
	c.Swarm = "testnet-alphaX"
	variants["swarm"] = c
	c = base
	c.IdentityKey = append(bytes.Clone(base.IdentityKey), 0)
	variants["key"] = c
	c = base
	c.Nonce = bytes.Repeat([]byte{0x02}, 32)
	variants["nonce"] = c
	c = base
	c.Term++
	variants["term"] = c
	// Moving a byte from one field to its neighbour must change the hash:
	// the length prefixes make the encoding unambiguous.
	c = base
	c.Swarm = base.Swarm + string(base.IdentityKey[:1])
	c.IdentityKey = base.IdentityKey[1:]
	variants["boundary"] = c
	rd := ReportData(base)
	seen := map[[64]byte]string{rd: "base"}
	for name, v := range variants {
		got := ReportData(v)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s hashes like %s", name, prev)
		}
		seen[got] = name
	}
}

func testEvidence() *Evidence {
	return &Evidence{
		Provider: "snp",
		Report:   bytes.Repeat([]byte{0x42}, 1184),
		Certs:    [][]byte{bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 50)},
		Claims:   testClaims(),
	}
}

func TestEvidenceRoundTrip(t *testing.T) {
	ev := testEvidence()
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalEvidence(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Provider != ev.Provider || !got.Claims.Equal(ev.Claims) || !bytes.Equal(got.Report, ev.Report) ||
		len(got.Certs) != 2 || !bytes.Equal(got.Certs[0], ev.Certs[0]) || !bytes.Equal(got.Certs[1], ev.Certs[1]) {
		t.Fatalf("round trip changed evidence: %+v", got)
	}
	b2, _ := got.Marshal()
	if !bytes.Equal(b, b2) {
		t.Fatal("re-encoding differs")
	}
}

func TestEvidenceBounds(t *testing.T) {
	mod := func(f func(*Evidence)) *Evidence { e := testEvidence(); f(e); return e }
	cases := []struct {
		name string
		ev   *Evidence
		ok   bool
	}{
		{"good", testEvidence(), true},
		{"no certs", mod(func(e *Evidence) { e.Certs = nil }), true},
		{"nonce at min", mod(func(e *Evidence) { e.Nonce = make([]byte, MinNonceBytes) }), true},
		{"nonce at max", mod(func(e *Evidence) { e.Nonce = make([]byte, MaxNonceBytes) }), true},
		{"nonce one short", mod(func(e *Evidence) { e.Nonce = make([]byte, MinNonceBytes-1) }), false},
		{"nonce one over", mod(func(e *Evidence) { e.Nonce = make([]byte, MaxNonceBytes+1) }), false},
		{"swarm empty", mod(func(e *Evidence) { e.Swarm = "" }), false},
		{"swarm at max", mod(func(e *Evidence) { e.Swarm = strings.Repeat("s", MaxSwarmBytes) }), true},
		{"swarm one over", mod(func(e *Evidence) { e.Swarm = strings.Repeat("s", MaxSwarmBytes+1) }), false},
		{"key empty", mod(func(e *Evidence) { e.IdentityKey = nil }), false},
		{"key one over", mod(func(e *Evidence) { e.IdentityKey = make([]byte, MaxIdentityKeyBytes+1) }), false},
		{"report empty", mod(func(e *Evidence) { e.Report = nil }), false},
		{"report at max", mod(func(e *Evidence) { e.Report = make([]byte, MaxReportBytes) }), true},
		{"report one over", mod(func(e *Evidence) { e.Report = make([]byte, MaxReportBytes+1) }), false},
		{"too many certs", mod(func(e *Evidence) { e.Certs = make([][]byte, MaxCerts+1) }), false},
		{"empty cert", mod(func(e *Evidence) { e.Certs = [][]byte{{}} }), false},
		{"cert one over", mod(func(e *Evidence) { e.Certs = [][]byte{make([]byte, MaxCertBytes+1)} }), false},
		{"whole over limit", mod(func(e *Evidence) {
			e.Report = make([]byte, MaxReportBytes)
			e.Certs = [][]byte{make([]byte, MaxCertBytes), make([]byte, MaxCertBytes)}
		}), false},
		{"provider upper case", mod(func(e *Evidence) { e.Provider = "SNP" }), false},
		{"provider empty", mod(func(e *Evidence) { e.Provider = "" }), false},
		{"provider control byte", mod(func(e *Evidence) { e.Provider = "snp\n" }), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.ev.Marshal()
			if tc.ok != (err == nil) {
				t.Fatalf("Marshal err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestUnmarshalRejects(t *testing.T) {
	good, err := testEvidence().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// Offsets in the encoding of testEvidence.
	provOff := 5
	swarmOff := provOff + 1 + 3
	cases := map[string][]byte{
		"empty":        nil,
		"bad magic":    append([]byte("XPTE"), good[4:]...),
		"bad version":  append(append([]byte{}, good[:4]...), append([]byte{2}, good[5:]...)...),
		"truncated":    good[:len(good)-1],
		"trailing":     append(bytes.Clone(good), 0),
		"over limit":   make([]byte, MaxEvidenceBytes+1),
		"swarm length": func() []byte { b := bytes.Clone(good); binary.BigEndian.PutUint16(b[swarmOff:], 0xFFFF); return b }(),
		"cert count": func() []byte {
			b := bytes.Clone(good)
			// The count byte precedes the two certificates (4+100, 4+50 bytes).
			b[len(b)-(4+100+4+50)-1] = 200
			return b
		}(),
		"report length huge": func() []byte {
			b := bytes.Clone(good)
			off := swarmOff + 2 + len("testnet-alpha") + 2 + 36 + 1 + 32 + 8
			binary.BigEndian.PutUint32(b[off:], 0xFFFFFFFF)
			return b
		}(),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := UnmarshalEvidence(b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzUnmarshalEvidence checks the decoder never panics, never returns
// evidence out of bounds, and that whatever it accepts re-encodes to the same
// bytes (the encoding is canonical).
func FuzzUnmarshalEvidence(f *testing.F) {
	good, _ := testEvidence().Marshal()
	f.Add(good)
	noCerts := testEvidence()
	noCerts.Certs = nil
	b, _ := noCerts.Marshal()
	f.Add(b)
	f.Add([]byte("HPTE\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := UnmarshalEvidence(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("decoded evidence out of bounds: %v", err)
		}
		again, err := ev.Marshal()
		if err != nil {
			t.Fatalf("accepted evidence does not re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatal("encoding is not canonical")
		}
	})
}
