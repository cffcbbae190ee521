package teetest

import (
	"bytes"
	"crypto/sha512"
	"fmt"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/holopeer/holopeer/tee/snp"
)

// SNPMeasurement is the launch measurement fake SNP guests report unless
// AMDOptions says otherwise.
var SNPMeasurement = sha384("holopeer teetest SEV-SNP guest image")

// SNPChipID is the CHIP_ID of the fake AMD chip unless AMDOptions says otherwise.
var SNPChipID = bytes.Repeat([]byte{0xC1}, abi.ChipIDSize)

func sha384(s string) []byte {
	h := sha512.Sum384([]byte(s))
	return h[:]
}

// AMDOptions describes the fake chip and the guest running on it.
type AMDOptions struct {
	Measurement []byte       // nil: SNPMeasurement
	ChipID      []byte       // nil: SNPChipID
	TCB         kds.TCBParts // the chip's firmware TCB, certified in its VCEK
	Debug       bool         // the guest policy allows debugging
	// OmitVCEK leaves the VCEK out of the host's certificate table, so the
	// attester must fetch it from the fake KDS (AMD.KDS).
	OmitVCEK bool
	// Now is when the fake chain was issued (default: now minus an hour).
	Now time.Time
}

// AMD is a fake AMD secure processor with a fake ARK → ASK → VCEK chain.
// It implements go-sev-guest's client.QuoteProvider, the interface the
// production snp attester calls on a real guest.
type AMD struct {
	opts    AMDOptions
	signer  *sevtest.AmdSigner
	product *spb.SevProduct
	certs   []byte // host certificate table
}

// NewAMD builds a fake chip and its certificate chain.
func NewAMD(o AMDOptions) (*AMD, error) {
	if o.Measurement == nil {
		o.Measurement = SNPMeasurement
	}
	if o.ChipID == nil {
		o.ChipID = SNPChipID
	}
	if len(o.Measurement) != abi.MeasurementSize || len(o.ChipID) != abi.ChipIDSize {
		return nil, fmt.Errorf("teetest: measurement %d bytes, chip id %d bytes", len(o.Measurement), len(o.ChipID))
	}
	if o.Now.IsZero() {
		o.Now = time.Now().Add(-time.Hour)
	}
	product := abi.DefaultSevProduct()
	name := kds.ProductName(product)
	tcb, err := kds.ComposeTCBParts(o.TCB)
	if err != nil {
		return nil, err
	}
	b := &sevtest.AmdSignerBuilder{
		Keys:             sevtest.DefaultAmdKeys(),
		ProductName:      name,
		CSPID:            "holopeer-teetest",
		ArkCreationTime:  o.Now,
		AskCreationTime:  o.Now,
		AsvkCreationTime: o.Now,
		VcekCreationTime: o.Now,
		VlekCreationTime: o.Now,
		TCB:              tcb,
		// The VCEK certifies this chip's id and TCB, as AMD KDS would.
		VcekCustom: sevtest.CertOverride{Extensions: sevtest.CustomExtensions(o.TCB, o.ChipID, "", name)},
	}
	copy(b.HWID[:], o.ChipID)
	signer, err := b.TestOnlyCertChain()
	if err != nil {
		return nil, err
	}
	signer.Product = product
	a := &AMD{opts: o, signer: signer, product: product}
	if !o.OmitVCEK {
		if a.certs, err = signer.CertTableBytes(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Roots are the fake ARK/ASK to pass to the verifier (tee.WithSNPRoots).
func (a *AMD) Roots() snp.Roots {
	return snp.Roots{kds.ProductLine(a.product): {{
		ProductLine:  kds.ProductLine(a.product),
		ProductCerts: &trust.ProductCerts{Ark: a.signer.Ark, Ask: a.signer.Ask, Asvk: a.signer.Asvk},
	}}}
}

// KDS is a fake AMD Key Distribution Service serving this chip's VCEK.
func (a *AMD) KDS() (trust.HTTPSGetter, error) { return sevtest.FakeKDSFromSigner(a.signer) }

// Attester is the production snp attester talking to this fake chip.
func (a *AMD) Attester() (*snp.Attester, error) {
	kdsGetter, err := a.KDS()
	if err != nil {
		return nil, err
	}
	return snp.NewAttester(snp.WithQuoteProvider(a), snp.WithKDSGetter(kdsGetter))
}

// IsSupported is always true for the fake.
func (a *AMD) IsSupported() bool { return true }

// Product is the fake chip's product (Milan).
func (a *AMD) Product() *spb.SevProduct { return a.product }

// GetRawQuote returns a signed version-3 attestation report followed by the
// host's certificate table, as configfs-tsm's outblob ‖ auxblob would.
func (a *AMD) GetRawQuote(reportData [64]byte) ([]byte, error) {
	tcb, err := kds.ComposeTCBParts(a.opts.TCB)
	if err != nil {
		return nil, err
	}
	r := &spb.Report{
		Version:          abi.ReportVersion3,
		Policy:           abi.SnpPolicyToBytes(abi.SnpPolicy{SMT: true, Debug: a.opts.Debug}),
		FamilyId:         make([]byte, abi.FamilyIDSize),
		ImageId:          make([]byte, abi.ImageIDSize),
		SignatureAlgo:    abi.SignEcdsaP384Sha384,
		CurrentTcb:       uint64(tcb),
		ReportedTcb:      uint64(tcb),
		CommittedTcb:     uint64(tcb),
		LaunchTcb:        uint64(tcb),
		ReportData:       reportData[:],
		Measurement:      a.opts.Measurement,
		HostData:         make([]byte, abi.HostDataSize),
		IdKeyDigest:      make([]byte, abi.IDKeyDigestSize),
		AuthorKeyDigest:  make([]byte, abi.AuthorKeyDigestSize),
		ReportId:         make([]byte, abi.ReportIDSize),
		ReportIdMa:       make([]byte, abi.ReportIDMASize),
		ChipId:           a.opts.ChipID,
		Cpuid1EaxFms:     abi.MaskedCpuid1EaxFromSevProduct(a.product),
		CurrentMajor:     1,
		CurrentMinor:     55,
		CommittedMajor:   1,
		CommittedMinor:   55,
		Signature:        make([]byte, abi.SignatureSize),
		SignerInfo:       abi.ComposeSignerInfo(abi.SignerInfo{SigningKey: abi.VcekReportSigner}),
		CurrentBuild:     0,
		CommittedBuild:   0,
		LaunchMitVector:  0,
		CurrentMitVector: 0,
	}
	raw, err := abi.ReportToAbiBytes(r)
	if err != nil {
		return nil, err
	}
	R, S, err := a.signer.Sign(abi.SignedComponent(raw))
	if err != nil {
		return nil, err
	}
	if err := abi.SetSignature(R, S, raw); err != nil {
		return nil, err
	}
	table, err := abi.ExtendPlatformCertTable(a.certs, &abi.ExtraPlatformInfo{
		Size:      abi.ExtraPlatformInfoV0Size,
		Cpuid1Eax: abi.MaskedCpuid1EaxFromSevProduct(a.product),
	})
	if err != nil {
		return nil, err
	}
	return append(raw, table...), nil
}

// Variant is another guest on the same fake chip (same chain and VCEK),
// with its measurement or debug policy changed by mod. Chip id and TCB are
// certified in the VCEK and stay those of the chip.
func (a *AMD) Variant(mod func(*AMDOptions)) *AMD {
	c := *a
	mod(&c.opts)
	c.opts.ChipID, c.opts.TCB = a.opts.ChipID, a.opts.TCB
	return &c
}
