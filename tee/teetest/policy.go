package teetest

import (
	"github.com/holopeer/holopeer/tee"
	"github.com/holopeer/holopeer/tee/snp"
	"github.com/holopeer/holopeer/tee/tdx"
)

// Policy accepts exactly what the fakes report by default: SNPMeasurement,
// and TDXMRTD with TDXRTMRs. Debug stays forbidden and sim disallowed.
func Policy() tee.Policy {
	return tee.Policy{
		SNP: snp.Policy{Measurements: [][]byte{SNPMeasurement}},
		TDX: tdx.Policy{Measurements: []tdx.Measurement{{MRTD: TDXMRTD, RTMRs: TDXRTMRs}}},
	}
}

// VerifierOptions trust the fake roots of amd and intel (either may be nil)
// in place of AMD's and Intel's.
func VerifierOptions(amd *AMD, intel *Intel) []tee.Option {
	var opts []tee.Option
	if amd != nil {
		opts = append(opts, tee.WithSNPRoots(amd.Roots()))
	}
	if intel != nil {
		opts = append(opts, tee.WithTDXRoots(intel.Roots()))
	}
	return opts
}
