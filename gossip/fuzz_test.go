package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/holopeer/holopeer/gossip/election"
	"github.com/holopeer/holopeer/tee"
)

// FuzzClaimEvidence feeds hostile bytes through the path a claim takes in
// the election validator: decode the message, derive the nonce, decode the
// evidence inside it and verify it with the real tee verifier (sim
// allowed, so the sim parser runs too). Nothing may panic, and anything
// accepted must bind exactly the claims the election expects.
func FuzzClaimEvidence(f *testing.F) {
	const swarm = "fuzz"
	v, err := tee.NewVerifier(tee.Policy{AllowSim: true}, tee.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		f.Fatal(err)
	}
	verify, err := TEEVerifier(v, swarm)
	if err != nil {
		f.Fatal(err)
	}
	svc := &Service{cfg: config{swarm: swarm, timing: fastTiming}}
	key, _, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{1}, 64)))
	if err != nil {
		f.Fatal(err)
	}
	s := signer{key: key}
	if s.id, err = peerIDOf(key); err != nil {
		f.Fatal(err)
	}
	seed := claimBy(f, svc, s, 3, 3, time.UnixMilli(1_800_000_000_000))
	f.Add(mustMarshal(f, seed))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, _, err := DecodeElection(b)
		if err != nil || c == nil {
			return
		}
		em := svc.toElection(c.Coordinator, c)
		nonce := election.Nonce(swarm, em.Term, em.Parent, em.Salt)
		att, err := verify(context.Background(), c.Coordinator, c.Term, nonce[:], c.Evidence)
		if err != nil {
			return
		}
		ev, err := tee.UnmarshalEvidence(c.Evidence)
		if err != nil {
			t.Fatalf("accepted evidence does not decode: %v", err)
		}
		if ev.Term != c.Term || !bytes.Equal(ev.Nonce, nonce[:]) || ev.Swarm != swarm || att.TEE != tee.ProviderSim {
			t.Fatalf("accepted evidence binds other claims: %+v vs term %d", ev.Claims, c.Term)
		}
	})
}
