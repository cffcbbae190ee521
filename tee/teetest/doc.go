// Package teetest builds fake roots of trust so that tests exercise the REAL
// SEV-SNP and TDX verification code without hardware: a fake AMD chain (ARK,
// ASK, VCEK from go-sev-guest's test helpers) behind a fake SEV-SNP
// firmware, and a hand-built fake Intel chain (root CA, PCK platform CA, PCK
// leaf) behind a fake TDX quoting enclave that signs v4 quotes.
//
// The fakes sit where the hardware sits: the production snp and tdx
// attesters call them through the same quote-provider interfaces they use
// on a real confidential VM, and the production verifiers check the result;
// only the trust anchor changes, passed in as roots. Evidence from these
// fakes must never verify against the production roots, and tests check
// that it does not.
//
// Import this package only from _test.go files: it pulls in go-sev-guest's
// testing package, which registers global flags and ships private keys.
package teetest
