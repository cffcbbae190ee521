package gossip

import (
	"context"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
)

// BenchmarkDecodeElection: decoding one heartbeat with sim evidence.
func BenchmarkDecodeElection(b *testing.B) {
	svc := &Service{cfg: config{swarm: "bench", timing: fastTiming}}
	s := signer{key: genKey(b)}
	s.id, _ = peerIDOf(s.key)
	data := mustMarshal(b, claimBy(b, svc, s, 1, 1, time.Now()))
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := DecodeElection(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidateHeartbeat: the election validator on a repeated
// heartbeat, whose evidence is verified once and then found in the cache.
func BenchmarkValidateHeartbeat(b *testing.B) {
	now := time.Now()
	svc := validatorServiceB(b, now)
	s := signer{key: genKey(b)}
	s.id, _ = peerIDOf(s.key)
	data := mustMarshal(b, claimBy(b, svc, s, 1, 1, now))
	m := pmsg(s.id, data)
	b.ResetTimer()
	for b.Loop() {
		if r := svc.validateElection(context.Background(), s.id, m); r != pubsub.ValidationAccept {
			b.Fatal(r)
		}
	}
}
