// Package tdx attests and verifies Intel TDX trust domains with
// github.com/google/go-tdx-guest.
//
// The attester asks the TDX module for a TD report with REPORT_DATA =
// tee.ReportData(claims) and has the host's quoting enclave turn it into a
// v4 quote, through configfs-tsm (or /dev/tdx_guest). A v4 quote carries its
// whole PCK certificate chain, so the evidence needs nothing else.
//
// The verifier is offline: the PCK chain must lead to the Intel SGX Root CA
// (embedded here, intel_sgx_root_ca.pem, SHA-256 fingerprint pinned in
// code), the PCK key must sign the quoting enclave's report, that report
// must bind the attestation key, and the attestation key must sign the quote.
// Collateral from Intel PCS (TCB info, QE identity, PCK and root CRLs) is
// NOT fetched: verify.Options.GetCollateral and CheckRevocations are off by
// configuration, so verification needs no network.
//
// What verified TDX evidence proves: a TD whose firmware hashes to MRTD
// (and, where the policy pins them, whose boot chain extended RTMR0-3 to
// these values), not debuggable unless the policy allows it, on a platform
// with this PPID and at least the policy's TEE TCB SVN, asked for a quote
// binding this swarm, identity key, nonce and term.
//
// What it does not prove:
//   - TCB status. Without Intel's collateral the verifier cannot tell an
//     up-to-date platform from an OutOfDate or Revoked one; an old platform
//     whose PCK certificate Intel has revoked still passes. MinTeeTCBSVN,
//     MinQESVN/MinPCESVN and RevokedChipIDs are our levers until collateral
//     is shipped in a policy bundle.
//   - That the image is safe. MRTD measures only the TD firmware (TDVF);
//     kernel, initrd, command line and the coordinator binary are in the
//     RTMRs, so a policy that does not pin RTMRs says little about the code.
//   - Freedom from hardware flaws, side channels and physical attacks;
//     liveness (the host can stop or partition the TD); trusted time.
package tdx
