// Package snp attests and verifies AMD SEV-SNP confidential VMs with
// github.com/google/go-sev-guest.
//
// The attester asks the guest firmware (AMD-SP) for an attestation report
// through the kernel's configfs-tsm interface, or /dev/sev-guest on older
// kernels, with REPORT_DATA = tee.ReportData(claims). The report is signed by
// the chip's VCEK (or a cloud's VLEK); the evidence carries that certificate.
// If the host did not provision it, the attester fetches the VCEK once from
// AMD's KDS (the only network use, on the attesting side).
//
// The verifier is offline: the VCEK must chain to AMD's ARK/ASK roots that
// go-sev-guest embeds (Milan, Genoa, Turin); it never downloads certificates
// or CRLs (DisableCertFetching, no CheckRevocations).
//
// What verified SNP evidence proves: an AMD SEV-SNP guest whose initial
// image hashes to MEASUREMENT, launched with this guest policy (debug off
// unless the policy allows it), on a chip with this CHIP_ID and at least the
// policy's firmware TCB, asked for a report binding this swarm, identity key,
// nonce and term. Together with the identity key being generated inside the
// guest, this means the peer's key lives in memory its host cannot read.
//
// What it does not prove:
//   - That the image is safe. MEASUREMENT covers the initial firmware image;
//     unless the VM uses measured direct boot (kernel, initrd and command
//     line hashed into the launch digest) or a UKI, the coordinator binary
//     is not covered. An image with a shell, SSH, or an unmeasured config
//     channel defeats everything.
//   - Revocation beyond the policy: without AMD's CRL a revoked VCEK or ASK
//     still verifies; MinTCB and RevokedChipIDs are the levers we ship.
//   - Freedom from hardware flaws and side channels (CacheWarp-class bugs,
//     physical bus interposers); these are fixed by TCB updates, which only
//     help once the policy's MinTCB is raised.
//   - Liveness: the host can stop, slow or partition the guest.
//   - Time: reports carry no trusted time; freshness rests on the nonce and
//     term in the binding.
//
// The TCB comparison uses go-sev-guest's (pre-Turin) TCB_VERSION layout.
package snp
