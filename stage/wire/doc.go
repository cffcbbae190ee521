// Package wire is holopeer's stage-to-stage data path: the
// /holopeer/stage/1.0.0 protocol that carries activations forward and
// activation gradients backward between neighbouring pipeline stages.
//
// Every training step and every generated token crosses it, so it has to
// be small, fast, and safe when the path runs through someone else's
// machine (a circuit relay, a router). A link is one libp2p stream per
// neighbour pair per job:
//
//  1. The initiator sends a cleartext preamble (version, job id). The
//     responder asks its Authorizer (the job's placement) whether the
//     remote peer belongs next to it in that job and resets the stream if
//     not, before any key is exchanged.
//  2. A Noise_XX_25519_ChaChaPoly_SHA256 handshake runs inside the stream,
//     so a relay carries only ciphertext. Its prologue binds both peer ids
//     and the job; each side's payload carries its libp2p identity key's
//     signature over its Noise static key and its codec fingerprint (for
//     the subspace codec: the hash of the shared basis U and E_fix). A
//     mismatch refuses the link.
//  3. Frames follow: a 48-byte header (job, step, microbatch, kind, codec,
//     shape, payload length) sealed together with the start of the payload
//     in one Noise record, the rest of the payload in records of at most
//     65519 plaintext bytes. The receiver checks each header against the
//     LinkSpec (codec, tokens × d or × k, step window, kind) before it
//     reads or allocates the payload, and charges the payload buffer to
//     the stream's resource scope.
//  4. A frame that breaks the spec ends the link: the receiver sends an
//     error frame saying why, resets the stream with a code in holopeer's
//     range, logs the refusal, and keeps serving its other links.
//
// The codec (package codec) is chosen per job: fp32, bf16, blockwise int8,
// or the Protocol Models subspace codec that sends k coefficients per
// token instead of d_model values.
package wire
