package teetest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/holopeer/holopeer/tee/tdx"
)

// TDXMRTD is the MRTD fake TDs report unless IntelOptions says otherwise.
var TDXMRTD = sha384("holopeer teetest TDX firmware")

// TDXRTMRs are the runtime measurement registers fake TDs report.
var TDXRTMRs = [4][]byte{
	sha384("rtmr0 teetest"), sha384("rtmr1 teetest"), sha384("rtmr2 teetest"), sha384("rtmr3 teetest"),
}

// TDXPPID is the platform id in the fake PCK certificate unless IntelOptions says otherwise.
var TDXPPID = bytes.Repeat([]byte{0xB2}, 16)

// IntelOptions describes the fake platform and the TD running on it.
type IntelOptions struct {
	MRTD      []byte    // nil: TDXMRTD
	RTMRs     [4][]byte // nil entries: TDXRTMRs
	Debug     bool      // TDATTRIBUTES.DEBUG
	TeeTCBSVN []byte    // 16 bytes; nil: all 3
	QESVN     uint16
	PCESVN    uint16
	PPID      []byte // nil: TDXPPID
	// Now is when the fake chain was issued; it is valid for a day from an
	// hour before Now (default: now).
	Now time.Time
}

// Intel is a fake Intel platform: a fake "Intel SGX Root CA" → "PCK
// Platform CA" → "PCK Certificate" chain (P-256, the names and extensions
// go-tdx-guest checks) and a fake quoting enclave that signs v4 quotes. It
// implements go-tdx-guest's client.QuoteProvider, the interface the
// production tdx attester calls in a real TD.
type Intel struct {
	opts                IntelOptions
	root, inter, pck    *x509.Certificate
	pckKey              *ecdsa.PrivateKey
	chainPEM            []byte
	NotBefore, NotAfter time.Time
}

// QE vendor id of Intel's quoting enclave.
var intelQEVendorID = []byte{0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07}

// NewIntel builds a fake Intel chain with fresh P-256 keys.
func NewIntel(o IntelOptions) (*Intel, error) {
	if o.MRTD == nil {
		o.MRTD = TDXMRTD
	}
	for i := range o.RTMRs {
		if o.RTMRs[i] == nil {
			o.RTMRs[i] = TDXRTMRs[i]
		}
	}
	if o.TeeTCBSVN == nil {
		o.TeeTCBSVN = bytes.Repeat([]byte{3}, 16)
	}
	if o.PPID == nil {
		o.PPID = TDXPPID
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if len(o.MRTD) != abi.MrTdSize || len(o.TeeTCBSVN) != abi.TeeTcbSvnSize || len(o.PPID) != 16 {
		return nil, errors.New("teetest: bad MRTD, TEE TCB SVN or PPID size")
	}
	f := &Intel{opts: o, NotBefore: o.Now.Add(-time.Hour), NotAfter: o.Now.Add(24 * time.Hour)}
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	interKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if f.pckKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	sgx, err := sgxExtension(o)
	if err != nil {
		return nil, err
	}
	if f.root, err = f.cert("Intel SGX Root CA", 1, rootKey, rootKey, nil, true, nil); err != nil {
		return nil, err
	}
	if f.inter, err = f.cert("Intel SGX PCK Platform CA", 2, interKey, rootKey, f.root, true, nil); err != nil {
		return nil, err
	}
	if f.pck, err = f.cert("Intel SGX PCK Certificate", 3, f.pckKey, interKey, f.inter, false, []pkix.Extension{sgx}); err != nil {
		return nil, err
	}
	for _, c := range []*x509.Certificate{f.pck, f.inter, f.root} {
		f.chainPEM = append(f.chainPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return f, nil
}

// cert issues a certificate shaped like Intel's: exactly the six
// extensions go-tdx-guest expects on a PCK leaf (AKI, SKI, CRL DP, key
// usage, basic constraints, and the SGX extension).
func (f *Intel) cert(cn string, serial int64, key, signer *ecdsa.PrivateKey, parent *x509.Certificate, ca bool, exts []pkix.Extension) (*x509.Certificate, error) {
	ski := sha256.Sum256(elliptic.MarshalCompressed(elliptic.P256(), key.X, key.Y))
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"TEST-ONLY fake Intel (holopeer teetest)"}},
		NotBefore:             f.NotBefore,
		NotAfter:              f.NotAfter,
		SignatureAlgorithm:    x509.ECDSAWithSHA256,
		BasicConstraintsValid: true,
		IsCA:                  ca,
		SubjectKeyId:          ski[:20],
		CRLDistributionPoints: []string{"https://invalid.example/teetest.crl"},
		ExtraExtensions:       exts,
	}
	if ca {
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment
	}
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// sgxAttr is one (OID, value) pair of the SGX extension.
type sgxAttr struct {
	Type  asn1.ObjectIdentifier
	Value any
}

var oidSGXType = asn1.ObjectIdentifier{1, 2, 840, 113741, 1, 13, 1, 5}

// sgxExtension encodes the PCK certificate's SGX extension (PPID, TCB with
// 16 CPU SVN components, PCE SVN and CPU SVN, PCEID, FMSPC, SGX type).
func sgxExtension(o IntelOptions) (pkix.Extension, error) {
	cpuSVN := bytes.Repeat([]byte{2}, 16)
	tcb := make([]sgxAttr, 0, 18)
	for i := 1; i <= 16; i++ {
		oid := append(append(asn1.ObjectIdentifier{}, pcs.OidTCB...), i)
		tcb = append(tcb, sgxAttr{oid, int(cpuSVN[i-1])})
	}
	tcb = append(tcb, sgxAttr{pcs.OidPCESvn, int(o.PCESVN)}, sgxAttr{pcs.OidCPUSvn, cpuSVN})
	val, err := asn1.Marshal([]sgxAttr{
		{pcs.OidPPID, o.PPID},
		{pcs.OidTCB, tcb},
		{pcs.OidPCEID, []byte{0, 0}},
		{pcs.OidFMSPC, []byte{0x00, 0x80, 0x6F, 0x05, 0x00, 0x00}},
		{oidSGXType, asn1.Enumerated(0)},
	})
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("teetest: SGX extension: %w", err)
	}
	return pkix.Extension{Id: pcs.OidSgxExtension, Value: val}, nil
}

// Roots is the pool holding the fake root, for the verifier (tee.WithTDXRoots).
func (f *Intel) Roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(f.root)
	return p
}

// Attester is the production tdx attester talking to this fake platform.
func (f *Intel) Attester() (*tdx.Attester, error) { return tdx.NewAttester(tdx.WithQuoteProvider(f)) }

// IsSupported reports the fake as available.
func (f *Intel) IsSupported() error { return nil }

// GetRawQuote returns a v4 quote over reportData, signed as Intel's quoting
// enclave signs: a fresh attestation key signs header ‖ TD quote body; the
// QE report binds that key (REPORT_DATA = SHA-256(key ‖ QE auth data)) and
// is signed by the PCK key; the PCK chain travels in the quote.
func (f *Intel) GetRawQuote(reportData [64]byte) ([]byte, error) {
	o := f.opts
	attrs := make([]byte, 8)
	if o.Debug {
		attrs[0] |= 1
	}
	le := func(v uint16) []byte { return []byte{byte(v), byte(v >> 8)} }
	q := &pb.QuoteV4{
		Header: &pb.Header{
			Version:            abi.QuoteVersion,
			AttestationKeyType: abi.AttestationKeyType,
			TeeType:            abi.TeeTDX,
			PceSvn:             le(o.PCESVN),
			QeSvn:              le(o.QESVN),
			QeVendorId:         intelQEVendorID,
			UserData:           make([]byte, 20),
		},
		TdQuoteBody: &pb.TDQuoteBody{
			TeeTcbSvn:      o.TeeTCBSVN,
			MrSeam:         sha384("teetest TDX module"),
			MrSignerSeam:   make([]byte, 48),
			SeamAttributes: make([]byte, 8),
			TdAttributes:   attrs,
			Xfam:           []byte{0xe7, 0x02, 0x06, 0, 0, 0, 0, 0},
			MrTd:           o.MRTD,
			MrConfigId:     make([]byte, 48),
			MrOwner:        make([]byte, 48),
			MrOwnerConfig:  make([]byte, 48),
			Rtmrs:          [][]byte{o.RTMRs[0], o.RTMRs[1], o.RTMRs[2], o.RTMRs[3]},
			ReportData:     reportData[:],
		},
	}
	ak, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	akRaw := append(ak.X.FillBytes(make([]byte, 32)), ak.Y.FillBytes(make([]byte, 32))...)
	authData := bytes.Repeat([]byte{0x5A}, 32)
	bind := sha256.Sum256(append(append([]byte{}, akRaw...), authData...))
	qeReport := &pb.EnclaveReport{
		CpuSvn:     bytes.Repeat([]byte{2}, 16),
		Reserved1:  make([]byte, 28),
		Attributes: make([]byte, 16),
		MrEnclave:  make([]byte, 32),
		Reserved2:  make([]byte, 32),
		MrSigner:   make([]byte, 32),
		Reserved3:  make([]byte, 96),
		IsvSvn:     uint32(o.QESVN),
		Reserved4:  make([]byte, 60),
		ReportData: append(bind[:], make([]byte, 32)...),
	}
	qeRaw, err := abi.EnclaveReportToAbiBytes(qeReport)
	if err != nil {
		return nil, err
	}
	qeSig, err := rawSign(f.pckKey, qeRaw)
	if err != nil {
		return nil, err
	}
	// Certification data: QE report (0x180) ‖ its signature (0x40) ‖
	// auth data (2 + n) ‖ PCK chain (type 2 + size 4 + n).
	certSize := 0x180 + 0x40 + 2 + len(authData) + 6 + len(f.chainPEM)
	q.SignedData = &pb.Ecdsa256BitQuoteV4AuthData{
		EcdsaAttestationKey: akRaw,
		CertificationData: &pb.CertificationData{
			CertificateDataType: 6,
			Size:                uint32(certSize),
			QeReportCertificationData: &pb.QEReportCertificationData{
				QeReport:          qeReport,
				QeReportSignature: qeSig,
				QeAuthData:        &pb.QeAuthData{ParsedDataSize: uint32(len(authData)), Data: authData},
				PckCertificateChainData: &pb.PCKCertificateChainData{
					CertificateDataType: 5,
					Size:                uint32(len(f.chainPEM)),
					PckCertChain:        f.chainPEM,
				},
			},
		},
	}
	// Signed data: signature (0x40) ‖ attestation key (0x40) ‖ type (2) ‖ size (4) ‖ certification data.
	q.SignedDataSize = uint32(0x40 + 0x40 + 6 + certSize)
	hdr, err := abi.HeaderToAbiBytes(q.Header)
	if err != nil {
		return nil, err
	}
	body, err := abi.TdQuoteBodyToAbiBytes(q.TdQuoteBody)
	if err != nil {
		return nil, err
	}
	if q.SignedData.Signature, err = rawSign(ak, append(hdr, body...)); err != nil {
		return nil, err
	}
	return abi.QuoteToAbiBytes(q)
}

// rawSign signs SHA-256(msg) and returns r ‖ s, 32 bytes each, as quotes carry them.
func rawSign(key *ecdsa.PrivateKey, msg []byte) ([]byte, error) {
	d := sha256.Sum256(msg)
	r, s, err := ecdsa.Sign(rand.Reader, key, d[:])
	if err != nil {
		return nil, err
	}
	out := make([]byte, 64)
	r.FillBytes(out[:32])
	s.FillBytes(out[32:])
	return out, nil
}

// Variant is another TD on the same fake platform (same chain and PCK
// key), its options changed by mod; the PPID and TCB of the PCK
// certificate stay those of the platform.
func (f *Intel) Variant(mod func(*IntelOptions)) *Intel {
	c := *f
	mod(&c.opts)
	return &c
}
