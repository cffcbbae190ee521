package gossip

import (
	"context"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
	"github.com/holopeer/holopeer/tee"
)

// TEEAttester makes election evidence with a tee.Attester: the claims bind
// the swarm, this node's identity public key, the election's nonce and the
// term.
func TEEAttester(a tee.Attester, swarm string, identity crypto.PubKey) (AttestFunc, error) {
	if a == nil {
		return nil, errors.New("gossip: nil tee attester")
	}
	key, err := crypto.MarshalPublicKey(identity)
	if err != nil {
		return nil, fmt.Errorf("gossip: identity key: %w", err)
	}
	return func(ctx context.Context, term uint64, nonce []byte) ([]byte, error) {
		ev, err := a.Attest(ctx, tee.Claims{Swarm: swarm, IdentityKey: key, Nonce: nonce, Term: term})
		if err != nil {
			return nil, err
		}
		return ev.Marshal()
	}, nil
}

// TEEVerifier checks election evidence with a tee.Verifier against the
// claims this node expects: its swarm, the identity key of the message's
// signed author, the nonce the election derives and the term.
func TEEVerifier(v *tee.Verifier, swarm string) (VerifyFunc, error) {
	if v == nil {
		return nil, errors.New("gossip: nil tee verifier")
	}
	return func(ctx context.Context, author lpeer.ID, term uint64, nonce, evidence []byte) (election.Attestation, error) {
		// holopeer identities are Ed25519, whose public key is inside the
		// peer ID: the key we check is the one pubsub verified the
		// message's signature with.
		pub, err := author.ExtractPublicKey()
		if err != nil {
			return election.Attestation{}, fmt.Errorf("gossip: public key of %s: %w", author, err)
		}
		key, err := crypto.MarshalPublicKey(pub)
		if err != nil {
			return election.Attestation{}, fmt.Errorf("gossip: public key of %s: %w", author, err)
		}
		ev, err := tee.UnmarshalEvidence(evidence)
		if err != nil {
			return election.Attestation{}, err
		}
		res, err := v.Verify(ctx, ev, tee.Claims{Swarm: swarm, IdentityKey: key, Nonce: nonce, Term: term})
		if err != nil {
			return election.Attestation{}, err
		}
		return election.Attestation{TEE: res.Provider, Insecure: res.Insecure}, nil
	}, nil
}
