package snp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/go-sev-guest/abi"
	sevclient "github.com/google/go-sev-guest/client"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	"github.com/google/uuid"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Provider is the evidence provider name.
const Provider = core.ProviderSNP

// Attester produces SEV-SNP evidence on this guest.
type Attester struct {
	qp     sevclient.QuoteProvider
	getter trust.HTTPSGetter // nil: never fetch a missing VCEK

	mu    sync.Mutex
	vceks map[string][]byte // KDS fetches by chip and TCB; they change only on firmware updates
}

// Option configures an Attester.
type Option func(*Attester) error

// WithQuoteProvider replaces the kernel interface (configfs-tsm or
// /dev/sev-guest) with qp; tests pass a fake AMD device from tee/teetest.
func WithQuoteProvider(qp sevclient.QuoteProvider) Option {
	return func(a *Attester) error {
		if qp == nil {
			return errors.New("snp: nil quote provider")
		}
		a.qp = qp
		return nil
	}
}

// WithKDSGetter sets how a VCEK missing from the host's certificate table is
// fetched from AMD KDS (default: HTTPS to kdsintf.amd.com); nil disables it.
func WithKDSGetter(g trust.HTTPSGetter) Option {
	return func(a *Attester) error {
		a.getter = g
		return nil
	}
}

// NewAttester opens the SEV-SNP guest interface: configfs-tsm first, then
// /dev/sev-guest. Without SEV-SNP it returns an error wrapping tee.ErrNoTEE.
func NewAttester(opts ...Option) (*Attester, error) {
	a := &Attester{getter: trust.DefaultHTTPSGetter(), vceks: map[string][]byte{}}
	for _, o := range opts {
		if err := o(a); err != nil {
			return nil, err
		}
	}
	if a.qp == nil {
		qp, err := sevclient.GetQuoteProvider()
		if err != nil {
			return nil, fmt.Errorf("%w: SEV-SNP: %v", core.ErrNoTEE, err)
		}
		a.qp = qp
	}
	return a, nil
}

// Provider returns "snp".
func (a *Attester) Provider() string { return Provider }

// Attest asks the AMD secure processor for a report over ReportData(c).
func (a *Attester) Attest(ctx context.Context, c core.Claims) (*core.Evidence, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rd := core.ReportData(c)
	raw, err := a.qp.GetRawQuote(rd)
	if err != nil {
		return nil, fmt.Errorf("snp: get report: %w", err)
	}
	if len(raw) < abi.ReportSize {
		return nil, fmt.Errorf("snp: report is %d bytes, want at least %d", len(raw), abi.ReportSize)
	}
	att, err := parseOwn(raw)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(att.Report.GetReportData(), rd[:]) {
		return nil, errors.New("snp: firmware returned a report for other report data")
	}
	if err := a.fillEndorsement(ctx, att); err != nil {
		return nil, err
	}
	certs, err := encodeCerts(att)
	if err != nil {
		return nil, err
	}
	return &core.Evidence{
		Provider: Provider,
		Report:   bytes.Clone(raw[:abi.ReportSize]),
		Certs:    certs,
		Claims:   c,
	}, nil
}

// parseOwn splits this guest's report ‖ certificate table. It reads the
// table entries itself rather than through CertTable.Proto, which logs a
// warning to stdout whenever the host provisioned no VCEK.
func parseOwn(raw []byte) (*spb.Attestation, error) {
	report, err := abi.ReportToProto(raw[:abi.ReportSize])
	if err != nil {
		return nil, fmt.Errorf("snp: parse own report: %w", err)
	}
	table := new(abi.CertTable)
	if err := table.Unmarshal(raw[abi.ReportSize:]); err != nil {
		return nil, fmt.Errorf("snp: parse host certificate table: %w", err)
	}
	chain := &spb.CertificateChain{Extras: map[string][]byte{}}
	for _, e := range table.Entries {
		switch e.GUID {
		case vcekGUID:
			chain.VcekCert = e.RawCert
		case vlekGUID:
			chain.VlekCert = e.RawCert
		case extraGUID:
			chain.Extras[abi.ExtraPlatformInfoGUID] = e.RawCert
		}
	}
	return &spb.Attestation{Report: report, CertificateChain: chain}, nil
}

// fillEndorsement makes sure the VCEK (or VLEK) that signed the report is
// in the chain, fetching a VCEK from AMD KDS once per chip and TCB.
func (a *Attester) fillEndorsement(ctx context.Context, att *spb.Attestation) error {
	info, err := abi.ParseSignerInfo(att.Report.GetSignerInfo())
	if err != nil {
		return fmt.Errorf("snp: own report: %w", err)
	}
	chain := att.GetCertificateChain()
	switch info.SigningKey {
	case abi.VlekReportSigner:
		if len(chain.GetVlekCert()) == 0 {
			return errors.New("snp: report signed by a VLEK but the host provided no VLEK certificate")
		}
		return nil
	case abi.VcekReportSigner:
		if len(chain.GetVcekCert()) != 0 {
			return nil
		}
	default:
		return fmt.Errorf("snp: report signed by unsupported key %v", info.SigningKey)
	}
	if a.getter == nil {
		return errors.New("snp: host provided no VCEK certificate and KDS fetching is disabled")
	}
	key := fmt.Sprintf("%x/%x", att.Report.GetChipId(), att.Report.GetReportedTcb())
	a.mu.Lock()
	vcek, ok := a.vceks[key]
	a.mu.Unlock()
	if !ok {
		full, err := verify.GetAttestationFromReportContext(ctx, att.Report, &verify.Options{Getter: a.getter})
		if err != nil {
			return fmt.Errorf("snp: fetch VCEK from AMD KDS: %w", err)
		}
		vcek = full.GetCertificateChain().GetVcekCert()
		a.mu.Lock()
		a.vceks[key] = vcek
		a.mu.Unlock()
	}
	if chain == nil {
		chain = &spb.CertificateChain{}
		att.CertificateChain = chain
	}
	chain.VcekCert = vcek
	return nil
}

var (
	vcekGUID  = uuid.MustParse(abi.VcekGUID)
	vlekGUID  = uuid.MustParse(abi.VlekGUID)
	extraGUID = uuid.MustParse(abi.ExtraPlatformInfoGUID)
)

// encodeCerts packs the certificate of the key that signed the report (VCEK
// or VLEK) and the platform info entry as GUID ‖ bytes, the shape of the
// SNP certificate table. ARK and ASK are left out: the verifier trusts only
// its own copies.
func encodeCerts(att *spb.Attestation) ([][]byte, error) {
	info, err := abi.ParseSignerInfo(att.GetReport().GetSignerInfo())
	if err != nil {
		return nil, fmt.Errorf("snp: own report: %w", err)
	}
	chain := att.GetCertificateChain()
	g, cert := vcekGUID, chain.GetVcekCert()
	if info.SigningKey == abi.VlekReportSigner {
		g, cert = vlekGUID, chain.GetVlekCert()
	}
	if len(cert) == 0 {
		return nil, errors.New("snp: no endorsement key certificate to send")
	}
	out := [][]byte{append(g[:len(g):len(g)], cert...)}
	if extra := chain.GetExtras()[abi.ExtraPlatformInfoGUID]; len(extra) > 0 {
		out = append(out, append(extraGUID[:len(extraGUID):len(extraGUID)], extra...))
	}
	return out, nil
}

// decodeCerts is encodeCerts' inverse for untrusted input: known GUIDs only,
// each at most once.
func decodeCerts(certs [][]byte) (*spb.CertificateChain, error) {
	chain := &spb.CertificateChain{Extras: map[string][]byte{}}
	seen := map[uuid.UUID]bool{}
	for i, c := range certs {
		if len(c) <= len(uuid.UUID{}) {
			return nil, fmt.Errorf("%w: SNP certificate entry %d is %d bytes", core.ErrMalformed, i, len(c))
		}
		g := uuid.UUID(c[:16])
		body := bytes.Clone(c[16:])
		if seen[g] {
			return nil, fmt.Errorf("%w: SNP certificate %s appears twice", core.ErrMalformed, g)
		}
		seen[g] = true
		switch g {
		case vcekGUID:
			chain.VcekCert = body
		case vlekGUID:
			chain.VlekCert = body
		case extraGUID:
			chain.Extras[abi.ExtraPlatformInfoGUID] = body
		default:
			return nil, fmt.Errorf("%w: unexpected SNP certificate entry %s", core.ErrMalformed, g)
		}
	}
	return chain, nil
}
