package core

import (
	"context"
	"encoding/hex"
	"fmt"
)

// Provider names, as carried in Evidence.Provider and shown in status lines.
const (
	ProviderSNP = "snp"
	ProviderTDX = "tdx"
	ProviderSim = "sim"
)

// Attester produces evidence for claims on this machine.
type Attester interface {
	// Provider is the name written into the evidence ("snp", "tdx", "sim").
	Provider() string
	// Attest asks the hardware (or the simulator) for a report whose
	// REPORT_DATA is ReportData(c), and packs it with its certificates.
	Attest(ctx context.Context, c Claims) (*Evidence, error)
}

// Result describes evidence that passed verification.
type Result struct {
	Provider string
	// Insecure is true exactly for the sim provider: the evidence was signed
	// by a testnet key, not by hardware, and proves nothing. Anything that
	// shows a coordinator must show this.
	Insecure bool
	// Measurement is what was launched: SNP MEASUREMENT, TDX MRTD, or the
	// sim's self-reported (unprovable) build hash.
	Measurement []byte
	// ChipID identifies the platform for revocation lists: SNP CHIP_ID, TDX
	// PPID from the PCK certificate, empty for sim.
	ChipID []byte
	// TCB is the firmware security version, human readable, for logs.
	TCB string
}

// Label is the provider name as a status line should print it: the sim
// provider always carries "INSECURE".
func (r Result) Label() string {
	if r.Insecure {
		return r.Provider + " (INSECURE)"
	}
	return r.Provider
}

// String summarises the result for logs.
func (r Result) String() string {
	m := hex.EncodeToString(r.Measurement)
	if len(m) > 16 {
		m = m[:16] + "…"
	}
	s := fmt.Sprintf("%s measurement=%s", r.Label(), m)
	if r.TCB != "" {
		s += " tcb=" + r.TCB
	}
	if r.Insecure {
		s += " — simulated TEE signed by a testnet key; proves nothing"
	}
	return s
}
