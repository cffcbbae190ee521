package tdx

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/google/go-tdx-guest/abi"
	tdxclient "github.com/google/go-tdx-guest/client"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/holopeer/holopeer/tee/internal/core"
)

// Provider is the evidence provider name.
const Provider = core.ProviderTDX

// Attester produces TDX evidence in this trust domain.
type Attester struct {
	qp tdxclient.QuoteProvider
}

// Option configures an Attester.
type Option func(*Attester) error

// WithQuoteProvider replaces configfs-tsm with qp; tests pass a fake Intel
// quoting enclave from tee/teetest.
func WithQuoteProvider(qp tdxclient.QuoteProvider) Option {
	return func(a *Attester) error {
		if qp == nil {
			return errors.New("tdx: nil quote provider")
		}
		a.qp = qp
		return nil
	}
}

// NewAttester opens the TDX guest interface: configfs-tsm, else
// /dev/tdx_guest. Without TDX it returns an error wrapping tee.ErrNoTEE.
func NewAttester(opts ...Option) (*Attester, error) {
	a := &Attester{}
	for _, o := range opts {
		if err := o(a); err != nil {
			return nil, err
		}
	}
	if a.qp == nil {
		qp, err := tdxclient.GetQuoteProvider()
		if err != nil {
			return nil, fmt.Errorf("%w: TDX: %v", core.ErrNoTEE, err)
		}
		if err := qp.IsSupported(); err != nil {
			// GetRawQuote falls back to the device when configfs-tsm is missing.
			d, derr := tdxclient.OpenDevice()
			if derr != nil {
				return nil, fmt.Errorf("%w: TDX: configfs-tsm: %v; /dev/tdx_guest: %v", core.ErrNoTEE, err, derr)
			}
			d.Close()
		}
		a.qp = qp
	}
	return a, nil
}

// Provider returns "tdx".
func (a *Attester) Provider() string { return Provider }

// Attest gets a v4 quote over ReportData(c).
func (a *Attester) Attest(ctx context.Context, c core.Claims) (*core.Evidence, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rd := core.ReportData(c)
	raw, err := tdxclient.GetRawQuote(a.qp, rd)
	if err != nil {
		return nil, fmt.Errorf("tdx: get quote: %w", err)
	}
	q, err := parseQuote(raw)
	if err != nil {
		return nil, fmt.Errorf("tdx: own quote: %w", err)
	}
	if !bytes.Equal(q.GetTdQuoteBody().GetReportData(), rd[:]) {
		return nil, errors.New("tdx: quoting enclave returned a quote for other report data")
	}
	if len(raw) > core.MaxReportBytes {
		return nil, fmt.Errorf("tdx: quote is %d bytes, evidence limit %d", len(raw), core.MaxReportBytes)
	}
	return &core.Evidence{Provider: Provider, Report: bytes.Clone(raw), Claims: c}, nil
}

// parseQuote parses a v4 quote, turning a parser panic on hostile bytes
// into ErrMalformed.
func parseQuote(raw []byte) (*pb.QuoteV4, error) {
	if err := checkLayout(raw); err != nil {
		return nil, err
	}
	var q any
	if err := core.Safely("TDX quote parser", func() (err error) {
		q, err = abi.QuoteToProto(raw)
		return err
	}); err != nil {
		return nil, core.Malformed("TDX quote", err)
	}
	v4, ok := q.(*pb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("%w: TDX quote type %T", core.ErrMalformed, q)
	}
	return v4, nil
}
