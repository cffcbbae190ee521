package snp

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Policy is what a swarm accepts from SEV-SNP coordinators. Beyond these
// fields the verifier always requires VMPL 0, no migration agent, and
// consistent TCB fields (go-sev-guest's validate package).
type Policy struct {
	// Measurements are the allowed MEASUREMENT values (48 bytes each). An
	// empty list allows none: a swarm must name the images it trusts.
	Measurements [][]byte `json:"measurements"`
	// MinTCB is the component-wise minimum REPORTED_TCB (bootloader, TEE,
	// SNP firmware, microcode security patch levels).
	MinTCB kds.TCBParts `json:"min_tcb"`
	// AllowDebug accepts guests whose policy lets the host debug (read) them.
	// Never set it outside a lab.
	AllowDebug bool `json:"allow_debug,omitempty"`
	// RevokedChipIDs lists 64-byte CHIP_IDs no longer trusted.
	RevokedChipIDs [][]byte `json:"revoked_chip_ids,omitempty"`
}

// Roots maps an AMD product line ("Milan", "Genoa", "Turin") to trusted
// ARK/ASK pairs. Nil means the AMD roots embedded in go-sev-guest; tests
// pass the fake chain from tee/teetest.
type Roots = map[string][]*trust.AMDRootCerts

// vmpl0 is the only privilege level we accept: a report from a lower
// privilege level (under an SVSM paravisor) does not speak for the VM's
// most privileged code.
var vmpl0 = 0

// Verify checks SEV-SNP evidence offline against the claims the caller
// expects, in order: parse, certificate chain and signature, binding, debug,
// revocation, measurement, TCB, then go-sev-guest's remaining consistency
// checks. Each failure wraps one tee sentinel. now is the time certificates
// must be valid at. Callers go through tee.Verifier, which compares the
// claims first.
func Verify(ctx context.Context, ev *core.Evidence, expect core.Claims, p Policy, roots Roots, now time.Time) (core.Result, error) {
	rd := core.ReportData(expect)
	if len(ev.Report) != abi.ReportSize {
		return core.Result{}, fmt.Errorf("%w: SNP report is %d bytes, want %d", core.ErrMalformed, len(ev.Report), abi.ReportSize)
	}
	chain, err := decodeCerts(ev.Certs)
	if err != nil {
		return core.Result{}, err
	}
	var report *spb.Report
	if err := core.Safely("SNP report parser", func() (err error) {
		report, err = abi.ReportToProto(ev.Report)
		return err
	}); err != nil {
		return core.Result{}, core.Malformed("SNP report", err)
	}
	att := &spb.Attestation{Report: report, CertificateChain: chain}

	// Chain to AMD's roots and report signature, offline.
	opts := &verify.Options{DisableCertFetching: true, TrustedRoots: roots, Now: now}
	if err := core.Safely("SNP verifier", func() error { return verify.SnpAttestationContext(ctx, att, opts) }); err != nil {
		return core.Result{}, classify(err, ev.Report, chain)
	}

	res := core.Result{
		Provider:    Provider,
		Measurement: bytes.Clone(report.GetMeasurement()),
		ChipID:      bytes.Clone(report.GetChipId()),
		TCB:         tcbString(kds.DecomposeTCBVersion(kds.TCBVersion(report.GetReportedTcb()))),
	}
	if !bytes.Equal(report.GetReportData(), rd[:]) {
		return res, fmt.Errorf("%w: SNP REPORT_DATA %x…", core.ErrBindingMismatch, report.GetReportData()[:8])
	}
	guest, err := abi.ParseSnpPolicy(report.GetPolicy())
	if err != nil {
		return res, fmt.Errorf("%w: SNP guest policy: %v", core.ErrMalformed, err)
	}
	if guest.Debug && !p.AllowDebug {
		return res, fmt.Errorf("%w: SNP guest policy allows debugging", core.ErrDebug)
	}
	for _, id := range p.RevokedChipIDs {
		if bytes.Equal(id, report.GetChipId()) {
			return res, fmt.Errorf("%w: SNP CHIP_ID %s…", core.ErrRevoked, hex.EncodeToString(id)[:16])
		}
	}
	if !contains(p.Measurements, report.GetMeasurement()) {
		return res, fmt.Errorf("%w: SNP MEASUREMENT %x", core.ErrMeasurement, report.GetMeasurement())
	}
	reported := kds.DecomposeTCBVersion(kds.TCBVersion(report.GetReportedTcb()))
	if !kds.TCBPartsLE(p.MinTCB, reported) {
		return res, fmt.Errorf("%w: SNP reported TCB %s, minimum %s", core.ErrTCB, tcbString(reported), tcbString(p.MinTCB))
	}
	vopts := &validate.Options{
		ReportData:  rd[:],
		GuestPolicy: abi.SnpPolicy{Debug: p.AllowDebug, SMT: true},
		MinimumTCB:  p.MinTCB,
		VMPL:        &vmpl0,
	}
	if err := core.Safely("SNP policy validator", func() error { return validate.SnpAttestation(att, vopts) }); err != nil {
		return res, fmt.Errorf("%w: SNP: %v", core.ErrPolicy, err)
	}
	return res, nil
}

// classify tells an untrusted chain from an altered report after
// go-sev-guest rejected the attestation (it returns unwrapped errors): if the
// report's signature checks out under the certificate it came with, the
// certificate is what failed.
func classify(err error, rawReport []byte, chain *spb.CertificateChain) error {
	if errors.Is(err, core.ErrMalformed) {
		return err
	}
	der := chain.GetVcekCert()
	if info, ierr := abi.ReportSignerInfo(rawReport); ierr == nil {
		if si, ierr := abi.ParseSignerInfo(info); ierr == nil && si.SigningKey == abi.VlekReportSigner {
			der = chain.GetVlekCert()
		}
	}
	cert, perr := x509.ParseCertificate(der)
	if perr != nil {
		return fmt.Errorf("%w: SNP endorsement certificate: %v", core.ErrUntrustedRoot, err)
	}
	if serr := core.Safely("SNP signature check", func() error { return verify.SnpReportSignature(rawReport, cert) }); serr != nil {
		return fmt.Errorf("%w: SNP: %v", core.ErrSignature, err)
	}
	return fmt.Errorf("%w: SNP: %v", core.ErrUntrustedRoot, err)
}

func contains(list [][]byte, v []byte) bool {
	for _, x := range list {
		if bytes.Equal(x, v) {
			return true
		}
	}
	return false
}

func tcbString(t kds.TCBParts) string {
	return fmt.Sprintf("bl:%d tee:%d snp:%d ucode:%d", t.BlSpl, t.TeeSpl, t.SnpSpl, t.UcodeSpl)
}
