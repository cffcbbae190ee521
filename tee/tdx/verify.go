package tdx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/validate"
	"github.com/google/go-tdx-guest/verify"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Measurement is one allowed TD image: its MRTD and, where set, its runtime
// measurement registers. A nil RTMR entry is not checked.
type Measurement struct {
	MRTD  []byte    `json:"mrtd"`
	RTMRs [4][]byte `json:"rtmrs,omitempty"`
}

// Policy is what a swarm accepts from TDX coordinators.
type Policy struct {
	// Measurements are the allowed images. An empty list allows none.
	Measurements []Measurement `json:"measurements"`
	// MinTeeTCBSVN is the component-wise minimum TEE_TCB_SVN (16 bytes, or
	// nil for no minimum).
	MinTeeTCBSVN []byte `json:"min_tee_tcb_svn,omitempty"`
	// MinQESVN and MinPCESVN are minimum quoting-enclave and PCE versions.
	MinQESVN  uint16 `json:"min_qe_svn,omitempty"`
	MinPCESVN uint16 `json:"min_pce_svn,omitempty"`
	// AllowDebug accepts TDs with TDATTRIBUTES.DEBUG set. Never outside a lab.
	AllowDebug bool `json:"allow_debug,omitempty"`
	// RevokedChipIDs lists platform PPIDs (16 bytes, from the PCK
	// certificate) no longer trusted.
	RevokedChipIDs [][]byte `json:"revoked_chip_ids,omitempty"`
}

//go:embed intel_sgx_root_ca.pem
var intelRootPEM []byte

// intelRootSHA256 pins the embedded root (Intel's published "Intel SGX Root
// CA", the same one go-tdx-guest embeds).
const intelRootSHA256 = "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3"

// ProductionRoots returns a pool holding only the Intel SGX Root CA. We pass
// it explicitly rather than nil because go-tdx-guest logs a warning to
// stdout each time it falls back to its embedded copy.
func ProductionRoots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(intelRoot)
	return pool
}

var intelRoot = func() *x509.Certificate {
	der, err := pemDER(intelRootPEM)
	if err != nil {
		panic("tdx: embedded Intel root: " + err.Error())
	}
	if sum := sha256.Sum256(der); hex.EncodeToString(sum[:]) != intelRootSHA256 {
		panic("tdx: embedded Intel root does not match its pinned fingerprint")
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		panic("tdx: embedded Intel root: " + err.Error())
	}
	return c
}()

// tdAttributesDebug is TDATTRIBUTES bit 0 (TUD.DEBUG): the host can read
// and change the TD's state.
const tdAttributesDebug = 1

// Verify checks TDX evidence offline against the claims the caller expects,
// in order: parse, PCK chain, QE report and quote signatures, binding,
// debug, revocation, measurement, TCB, then go-tdx-guest's validation. Each
// failure wraps one tee sentinel. roots nil means ProductionRoots. Intel PCS
// collateral (TCB status, QE identity, CRLs) is not consulted; see the
// package documentation. Callers go through tee.Verifier.
func Verify(ctx context.Context, ev *core.Evidence, expect core.Claims, p Policy, roots *x509.CertPool, now time.Time) (core.Result, error) {
	rd := core.ReportData(expect)
	if len(ev.Certs) != 0 {
		return core.Result{}, fmt.Errorf("%w: TDX evidence carries its chain in the quote, got %d extra certificates", core.ErrMalformed, len(ev.Certs))
	}
	q, err := parseQuote(ev.Report)
	if err != nil {
		return core.Result{}, err
	}
	if roots == nil {
		roots = ProductionRoots()
	}
	opts := &verify.Options{
		// Offline by configuration: no PCS collateral, no CRL download.
		GetCollateral:    false,
		CheckRevocations: false,
		TrustedRoots:     roots,
		Now:              &verify.TimeSet{PckCertChain: now, TcbInfo: now, QeIdentity: now, PckCrl: now, RootCaCrl: now},
	}
	if err := core.Safely("TDX verifier", func() error { return verify.TdxQuoteContext(ctx, q, opts) }); err != nil {
		return core.Result{}, classify(err, q, roots, now)
	}
	body := q.GetTdQuoteBody()
	chain, err := verify.ExtractChainFromQuote(q)
	if err != nil {
		return core.Result{}, core.Malformed("TDX PCK chain", err)
	}
	exts, err := pcs.PckCertificateExtensions(chain.PCKCertificate)
	if err != nil {
		return core.Result{}, core.Malformed("TDX PCK extensions", err)
	}
	ppid, err := hex.DecodeString(exts.PPID)
	if err != nil {
		return core.Result{}, core.Malformed("TDX PPID", err)
	}
	qeSVN := le16(q.GetHeader().GetQeSvn())
	pceSVN := le16(q.GetHeader().GetPceSvn())
	res := core.Result{
		Provider:    Provider,
		Measurement: bytes.Clone(body.GetMrTd()),
		ChipID:      ppid,
		TCB:         fmt.Sprintf("tee_tcb_svn:%x qe:%d pce:%d", body.GetTeeTcbSvn(), qeSVN, pceSVN),
	}
	if !bytes.Equal(body.GetReportData(), rd[:]) {
		return res, fmt.Errorf("%w: TDX REPORT_DATA %x…", core.ErrBindingMismatch, body.GetReportData()[:8])
	}
	if attrs := body.GetTdAttributes(); len(attrs) > 0 && attrs[0]&tdAttributesDebug != 0 && !p.AllowDebug {
		return res, fmt.Errorf("%w: TDX TDATTRIBUTES.DEBUG is set", core.ErrDebug)
	}
	for _, id := range p.RevokedChipIDs {
		if bytes.Equal(id, ppid) {
			return res, fmt.Errorf("%w: TDX PPID %x", core.ErrRevoked, id)
		}
	}
	if !allowed(p.Measurements, body) {
		return res, fmt.Errorf("%w: TDX MRTD %x with RTMRs not on the allowlist", core.ErrMeasurement, body.GetMrTd())
	}
	if p.MinTeeTCBSVN != nil && !svnAtLeast(body.GetTeeTcbSvn(), p.MinTeeTCBSVN) {
		return res, fmt.Errorf("%w: TDX TEE_TCB_SVN %x, minimum %x", core.ErrTCB, body.GetTeeTcbSvn(), p.MinTeeTCBSVN)
	}
	if qeSVN < p.MinQESVN || pceSVN < p.MinPCESVN {
		return res, fmt.Errorf("%w: TDX QE SVN %d PCE SVN %d, minimum %d and %d", core.ErrTCB, qeSVN, pceSVN, p.MinQESVN, p.MinPCESVN)
	}
	vopts := &validate.Options{
		HeaderOptions: validate.HeaderOptions{MinimumQeSvn: p.MinQESVN, MinimumPceSvn: p.MinPCESVN},
		TdQuoteBodyOptions: validate.TdQuoteBodyOptions{
			ReportData:       rd[:],
			MinimumTeeTcbSvn: p.MinTeeTCBSVN,
		},
	}
	if err := core.Safely("TDX validator", func() error { return validate.TdxQuote(q, vopts) }); err != nil {
		return res, fmt.Errorf("%w: TDX: %v", core.ErrPolicy, err)
	}
	return res, nil
}

// classify tells an untrusted chain from an altered quote after
// go-tdx-guest rejected it (its errors are mostly unwrapped): if the PCK
// chain verifies to our roots at now, the signatures are what failed.
func classify(err error, q *pb.QuoteV4, roots *x509.CertPool, now time.Time) error {
	if errors.Is(err, core.ErrMalformed) {
		return err
	}
	chain, cerr := verify.ExtractChainFromQuote(q)
	if cerr != nil {
		return fmt.Errorf("%w: TDX: %v", core.ErrUntrustedRoot, err)
	}
	inter := x509.NewCertPool()
	inter.AddCert(chain.IntermediateCertificate)
	if _, verr := chain.PCKCertificate.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now}); verr != nil {
		return fmt.Errorf("%w: TDX: %v", core.ErrUntrustedRoot, err)
	}
	return fmt.Errorf("%w: TDX: %v", core.ErrSignature, err)
}

func allowed(list []Measurement, body *pb.TDQuoteBody) bool {
	for _, m := range list {
		if !bytes.Equal(m.MRTD, body.GetMrTd()) {
			continue
		}
		ok := true
		for i, want := range m.RTMRs {
			if want != nil && (i >= len(body.GetRtmrs()) || !bytes.Equal(want, body.GetRtmrs()[i])) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func svnAtLeast(got, min []byte) bool {
	if len(got) != len(min) {
		return false
	}
	for i := range got {
		if got[i] < min[i] {
			return false
		}
	}
	return true
}

func le16(b []byte) uint16 {
	if len(b) != 2 {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}
