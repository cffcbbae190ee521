package tdx

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	tdxtestdata "github.com/google/go-tdx-guest/testing/testdata"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Each hostile length field is refused by checkLayout, before the library
// parser (which would panic on several of them) runs.
func TestQuoteLayoutRejectsHostileLengths(t *testing.T) {
	good := tdxtestdata.RawQuote
	if err := checkLayout(good); err != nil {
		t.Fatalf("real quote: %v", err)
	}
	sd := signedDataStart
	cert := sd + sigAndKey + certHeader
	put32 := func(off int, v uint32) []byte {
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	put16 := func(off int, v uint16) []byte {
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint16(b[off:], v)
		return b
	}
	cases := map[string][]byte{
		"short":                  good[:minQuoteSize-1],
		"version 5":              put16(0, 5),
		"signed data size 10":    put32(quoteHeaderAndBody, 10),
		"signed data size huge":  put32(quoteHeaderAndBody, 0xFFFFFFFF),
		"cert size off by one":   put32(sd+sigAndKey+2, binary.LittleEndian.Uint32(good[sd+sigAndKey+2:])+1),
		"cert size tiny":         put32(sd+sigAndKey+2, 4),
		"auth data past the end": put16(cert+qeReportAndSig, 0xFFFF),
		"chain size wrong":       put32(cert+qeReportAndSig+2+int(binary.LittleEndian.Uint16(good[cert+qeReportAndSig:]))+2, 1),
	}
	for name, q := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := parseQuote(q)
			if !errors.Is(err, core.ErrMalformed) || strings.Contains(err.Error(), "panicked") {
				t.Fatalf("err = %v, want a layout error", err)
			}
		})
	}
}
