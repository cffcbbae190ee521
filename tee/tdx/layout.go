package tdx

import (
	"encoding/binary"
	"fmt"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Byte layout of a TDX v4 quote (Intel TDX DCAP Quoting Library API, "Quote
// Format"), as far as checkLayout needs it.
const (
	quoteHeaderAndBody = 0x30 + 0x248 // header ‖ TD quote body
	signedDataStart    = quoteHeaderAndBody + 4
	minQuoteSize       = 0x3FC        // go-tdx-guest's abi.QuoteMinSize
	sigAndKey          = 0x40 + 0x40  // ECDSA signature ‖ attestation key
	certHeader         = 2 + 4        // certification data type ‖ size
	qeReportAndSig     = 0x180 + 0x40 // QE report ‖ its signature
	maxQuoteBytes      = core.MaxReportBytes
)

// checkLayout walks the length fields of a v4 quote and rejects any that
// point outside the quote or disagree with each other, before go-tdx-guest's
// parser sees it: that parser slices by these fields and panics on hostile
// ones (for example a SignedDataSize below 0x80).
func checkLayout(q []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: TDX quote layout: %s", core.ErrMalformed, fmt.Sprintf(format, args...))
	}
	if len(q) < minQuoteSize || len(q) > maxQuoteBytes {
		return bad("%d bytes, want %d..%d", len(q), minQuoteSize, maxQuoteBytes)
	}
	if v := binary.LittleEndian.Uint16(q[0:2]); v != 4 {
		return bad("version %d, want 4", v)
	}
	sdSize := uint64(binary.LittleEndian.Uint32(q[quoteHeaderAndBody:signedDataStart]))
	if sdSize > uint64(len(q)-signedDataStart) {
		return bad("signed data size %d exceeds the %d bytes left", sdSize, len(q)-signedDataStart)
	}
	sd := q[signedDataStart : signedDataStart+int(sdSize)]
	if len(sd) < sigAndKey+certHeader {
		return bad("signed data is %d bytes", len(sd))
	}
	certSize := uint64(binary.LittleEndian.Uint32(sd[sigAndKey+2 : sigAndKey+certHeader]))
	cert := sd[sigAndKey+certHeader:]
	if certSize != uint64(len(cert)) {
		return bad("certification data size %d, %d bytes present", certSize, len(cert))
	}
	if len(cert) < qeReportAndSig+2 {
		return bad("certification data is %d bytes", len(cert))
	}
	authEnd := qeReportAndSig + 2 + int(binary.LittleEndian.Uint16(cert[qeReportAndSig:qeReportAndSig+2]))
	if authEnd+certHeader > len(cert) {
		return bad("QE auth data runs past the certification data")
	}
	chainSize := uint64(binary.LittleEndian.Uint32(cert[authEnd+2 : authEnd+certHeader]))
	if chainSize != uint64(len(cert)-authEnd-certHeader) {
		return bad("PCK chain size %d, %d bytes present", chainSize, len(cert)-authEnd-certHeader)
	}
	return nil
}
