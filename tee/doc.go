// Package tee lets a holopeer peer prove, and every other peer check, that
// it runs inside a hardware trusted execution environment (AMD SEV-SNP or
// Intel TDX) and that its libp2p identity key lives there. Only peers with
// such evidence stand as coordinator; a peer that cannot attest (a Mac, a
// plain CPU box, --tee none) still votes and computes.
//
// # Binding
//
// Evidence vouches for Claims: the swarm, the peer's libp2p identity public
// key, a fresh nonce and the election term. Every provider puts
// ReportData(claims) — SHA-512 over a domain string and the length-prefixed
// fields — into its hardware report's REPORT_DATA. A verifier never trusts
// the claims the evidence carries: it compares them with the claims it
// expects (the key of the peer on the authenticated stream, the nonce and
// term of the election) and recomputes ReportData from its own.
//
// # Use
//
// Attesting (the candidate):
//
//	a, err := tee.NewAttester(ctx, tee.ModeAuto)   // or Detect(ctx); ModeNone gives nil
//	c, err := tee.NewClaims(swarm, host.Peerstore().PubKey(self), nonce, term)
//	ev, err := a.Attest(ctx, c)
//	wire, err := ev.Marshal()                       // at most MaxEvidenceBytes
//
// Verifying (every peer, before following a coordinator):
//
//	v, err := tee.NewVerifier(policy)               // production AMD/Intel roots
//	ev, err := tee.UnmarshalEvidence(wire)
//	want, err := tee.NewClaims(swarm, senderPubKey, nonce, term)
//	res, err := v.Verify(ctx, ev, want)
//	// errors.Is(err, tee.ErrStaleNonce), ... name the reason;
//	// res.Insecure marks sim, res.Label() prints "sim (INSECURE)".
//
// Evidence for a term is useless in the next: re-attest every term.
//
// # Providers
//
//   - snp (package tee/snp): AMD SEV-SNP via go-sev-guest; offline
//     verification against AMD's roots embedded in go-sev-guest.
//   - tdx (package tee/tdx): Intel TDX via go-tdx-guest; offline
//     verification against the embedded Intel SGX Root CA, without Intel
//     PCS collateral.
//   - sim (package tee/sim): INSECURE. Signed by a testnet key, accepted only
//     where Policy.AllowSim is set; Result.Insecure is true and anything
//     that shows a coordinator must say INSECURE (Result.Label does).
//
// # Threats covered
//
// With a policy that pins measurements (SNP MEASUREMENT with measured
// direct boot, or TDX MRTD plus RTMRs) and minimum TCBs:
//   - a peer without TEE hardware claiming to be a coordinator (no chain to
//     AMD or Intel);
//   - key substitution: evidence for key A cannot vouch for peer B;
//   - replay across nonces, terms or swarms;
//   - the host reading or altering the coordinator's memory (within what
//     SEV-SNP and TDX guarantee);
//   - debug-enabled guests, images off the allowlist, outdated firmware,
//     chips on the revocation list;
//   - test or sim evidence passing in production (separate roots; sim
//     refused unless the swarm allows it).
//
// # Not covered
//
//   - What the image does: attestation says which image booted, not that
//     it is safe. An image with SSH, a debug shell or an unmeasured config
//     channel defeats all of this, and MEASUREMENT/MRTD alone do not cover
//     the kernel and coordinator binary (measured direct boot, RTMRs).
//   - The coordinator's identity key must be generated inside the TEE and
//     never leave it; the binding cannot tell an imported key.
//   - Hardware and microcode breaks, side channels, physical attacks; we
//     rely on AMD/Intel TCB updates and on shipping a raised MinTCB.
//   - Revocation beyond the policy: verification is offline, without AMD
//     CRLs or Intel TCB-status collateral.
//   - Availability: a host can stop, slow or partition its coordinator; the
//     election must tolerate that.
//   - Time: reports carry no trusted time; freshness comes from nonce and term.
//   - Compute nodes (Macs, plain Linux, GPUs) prove only possession of their
//     libp2p key; NVIDIA GPU attestation is not verified.
//   - The sim provider: no security at all.
package tee
