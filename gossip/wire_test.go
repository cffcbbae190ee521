package gossip

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	hpeer "github.com/holopeer/holopeer/peer"
)

func testID(t testing.TB, seed byte) lpeer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{seed}, 64)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := lpeer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

var wireTime = time.UnixMilli(1_800_000_000_123)

func sampleClaim(t testing.TB) *Claim {
	c := &Claim{
		Candidacy: true, Term: 7, IssuedAt: wireTime, Lease: 5 * time.Second, Seq: 0,
		Coordinator: testID(t, 1), Evidence: []byte("evidence"),
		Parent: ClaimParent{Term: 6, Coordinator: testID(t, 2), Seq: 41},
	}
	c.Beacon[0], c.Salt[31], c.Parent.Beacon[5] = 1, 2, 3
	return c
}

func mustMarshal(t testing.TB, m interface{ Marshal() ([]byte, error) }) []byte {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWireRoundTrip(t *testing.T) {
	c := sampleClaim(t)
	got, v, err := DecodeElection(mustMarshal(t, c))
	if err != nil || v != nil || !reflect.DeepEqual(normalize(got), normalize(c)) {
		t.Fatalf("claim round trip: %v\n got %+v\nwant %+v", err, got, c)
	}
	hb := sampleClaim(t)
	hb.Candidacy, hb.Seq, hb.Resign = false, 9, true
	hb.Parent = ClaimParent{} // first election
	hb.Term = 1
	if got, _, err := DecodeElection(mustMarshal(t, hb)); err != nil || !reflect.DeepEqual(normalize(got), normalize(hb)) {
		t.Fatalf("heartbeat round trip: %v\n got %+v\nwant %+v", err, got, hb)
	}
	vote := &Vote{Term: 3, IssuedAt: wireTime, Voter: testID(t, 3), Coordinator: testID(t, 4)}
	if c, got, err := DecodeElection(mustMarshal(t, vote)); err != nil || c != nil || !reflect.DeepEqual(normalize(got), normalize(vote)) {
		t.Fatalf("vote round trip: %v %+v", err, got)
	}
	pv := &Vote{Term: 3, IssuedAt: wireTime, Voter: testID(t, 3), Coordinator: testID(t, 4), Evidence: []byte("evidence"),
		Parent: ClaimParent{Term: 2, Coordinator: testID(t, 5), Seq: 7}}
	pv.Salt[0], pv.Parent.Beacon[0] = 1, 2
	if c, got, err := DecodeElection(mustMarshal(t, pv)); err != nil || c != nil || !reflect.DeepEqual(normalize(got), normalize(pv)) {
		t.Fatalf("vote with proof round trip: %v %+v", err, got)
	}
	gv := *pv
	gv.Parent = ClaimParent{}
	if _, got, err := DecodeElection(mustMarshal(t, &gv)); err != nil || !reflect.DeepEqual(normalize(got), normalize(&gv)) {
		t.Fatalf("vote with a first-election proof round trip: %v %+v", err, got)
	}
	if b := mustMarshal(t, pv); len(b) > MaxElectionBytes {
		t.Fatalf("vote with proof is %d bytes, over MaxElectionBytes", len(b))
	}
	p := &PresenceMsg{IssuedAt: wireTime, Capability: []byte("sealed")}
	if got, err := DecodePresence(mustMarshal(t, p)); err != nil || !reflect.DeepEqual(normalize(got), normalize(p)) {
		t.Fatalf("presence round trip: %v %+v", err, got)
	}
	j := &JobMsg{Term: 5, IssuedAt: wireTime, Payload: []byte{}}
	if got, err := DecodeJob(mustMarshal(t, j)); err != nil || !reflect.DeepEqual(normalize(got), normalize(j)) {
		t.Fatalf("job round trip: %v %+v", err, got)
	}
}

// normalize strips the monotonic/location parts of times so DeepEqual
// compares what the wire carries.
func normalize(v any) any {
	switch m := v.(type) {
	case *Claim:
		c := *m
		c.IssuedAt = time.UnixMilli(c.IssuedAt.UnixMilli())
		return c
	case *Vote:
		c := *m
		c.IssuedAt = time.UnixMilli(c.IssuedAt.UnixMilli())
		return c
	case *PresenceMsg:
		c := *m
		c.IssuedAt = time.UnixMilli(c.IssuedAt.UnixMilli())
		return c
	case *JobMsg:
		c := *m
		c.IssuedAt = time.UnixMilli(c.IssuedAt.UnixMilli())
		if c.Payload == nil {
			c.Payload = []byte{}
		}
		return c
	}
	return v
}

// TestWireBounds checks the edges of every length: 0, the maximum, one past.
func TestWireBounds(t *testing.T) {
	claimWith := func(n int) []byte {
		c := sampleClaim(t)
		c.Evidence = bytes.Repeat([]byte{7}, min(max(n, 1), MaxEvidenceBytes))
		b := mustMarshal(t, c)
		// Forge the length field where Marshal would refuse.
		b = b[:len(b)-len(c.Evidence)-4]
		b = append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		return append(b, bytes.Repeat([]byte{7}, n)...)
	}
	jobWith := func(n int) []byte {
		b := mustMarshal(t, &JobMsg{Term: 1, IssuedAt: wireTime, Payload: make([]byte, min(n, MaxJobPayload))})
		if n > MaxJobPayload { // forge the length field and append the bytes
			b = b[:2+16]
			b = append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
			b = append(b, make([]byte, n)...)
		}
		return b
	}
	presenceWith := func(n int) []byte {
		b := []byte{byte(TypePresence), WireVersion, 0, 0, 1, 0xa3, 0, 0, 0, 0, byte(n >> 8), byte(n)}
		return append(b, make([]byte, n)...)
	}
	tests := []struct {
		name string
		b    []byte
		dec  func([]byte) error
		ok   bool
	}{
		{"evidence 0", claimWith(0), decElection, false},
		{"evidence 1", claimWith(1), decElection, true},
		{"evidence max", claimWith(MaxEvidenceBytes), decElection, true},
		{"evidence max+1", claimWith(MaxEvidenceBytes + 1), decElection, false},
		{"job payload 0", jobWith(0), decJob, true},
		{"job payload max", jobWith(MaxJobPayload), decJob, true},
		{"job payload max+1", jobWith(MaxJobPayload + 1), decJob, false},
		{"presence 0", presenceWith(0), decPresence, false},
		{"presence max", presenceWith(hpeer.MaxCapabilityBytes), decPresence, true},
		{"presence max+1", presenceWith(hpeer.MaxCapabilityBytes + 1), decPresence, false},
		{"empty", nil, decElection, false},
		{"type only", []byte{byte(TypeVote)}, decElection, false},
		{"unknown type", []byte{0x7f, WireVersion}, decElection, false},
		{"presence on election", presenceWith(10), decElection, false},
		{"version 2", append([]byte{byte(TypeVote), 2}, mustMarshal(t, &Vote{Term: 1, IssuedAt: wireTime, Voter: testID(t, 1), Coordinator: testID(t, 2)})[2:]...), decElection, false},
		{"trailing byte", append(mustMarshal(t, sampleClaim(t)), 0), decElection, false},
		{"vote trailing byte", append(mustMarshal(t, &Vote{Term: 1, IssuedAt: wireTime, Voter: testID(t, 1), Coordinator: testID(t, 2)}), 0), decElection, false},
		{"vote proof truncated", func() []byte {
			b := mustMarshal(t, &Vote{Term: 3, IssuedAt: wireTime, Voter: testID(t, 1), Coordinator: testID(t, 2), Evidence: []byte("e")})
			return b[:len(b)-1]
		}(), decElection, false},
		{"vote proof with parent not older", func() []byte {
			b := mustMarshal(t, &Vote{Term: 3, IssuedAt: wireTime, Voter: testID(t, 1), Coordinator: testID(t, 2), Evidence: []byte("e"),
				Parent: ClaimParent{Term: 2, Coordinator: testID(t, 5)}})
			// Rewrite parent_term (after the salt) to 3 = term.
			off := 2 + 8 + 8 + 1 + len(testID(t, 1)) + 1 + len(testID(t, 2)) + 32
			b[off+7] = 3
			return b
		}(), decElection, false},
		{"truncated", mustMarshal(t, sampleClaim(t))[:40], decElection, false},
	}
	for _, tt := range tests {
		err := tt.dec(tt.b)
		if (err == nil) != tt.ok {
			t.Errorf("%s (%d bytes): err = %v, want ok=%v", tt.name, len(tt.b), err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrWire) {
			t.Errorf("%s: error %v does not wrap ErrWire", tt.name, err)
		}
	}
}

func decElection(b []byte) error { _, _, err := DecodeElection(b); return err }
func decPresence(b []byte) error { _, err := DecodePresence(b); return err }
func decJob(b []byte) error      { _, err := DecodeJob(b); return err }

// TestClaimRules: claims that decode but break a rule are refused by the
// decoder with the rule named.
func TestClaimRules(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*Claim)
		want string
	}{
		{"term 0", func(c *Claim) { c.Term, c.Parent = 0, ClaimParent{} }, "term"},
		{"parent not older", func(c *Claim) { c.Parent.Term = c.Term }, "parent term"},
		{"parent without coordinator", func(c *Claim) { c.Parent.Coordinator = "" }, "parent"},
	} {
		c := sampleClaim(t)
		tt.mod(c)
		b, err := c.Marshal()
		if err == nil {
			_, _, err = DecodeElection(b)
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want mention of %q", tt.name, err, tt.want)
		}
	}
	// Unknown flag bits are refused rather than ignored.
	b := mustMarshal(t, sampleClaim(t))
	b[2+8+8+4+8] |= 0x80
	if _, _, err := DecodeElection(b); err == nil || !strings.Contains(err.Error(), "flags") {
		t.Errorf("unknown flag: err = %v", err)
	}
}

// Fuzz targets: whatever a decoder accepts must re-encode to exactly the
// same bytes (the encoding is canonical), and nothing may panic.

func FuzzDecodeElection(f *testing.F) {
	f.Add(mustMarshal(f, sampleClaim(f)))
	f.Add(mustMarshal(f, &Vote{Term: 3, IssuedAt: wireTime, Voter: testID(f, 3), Coordinator: testID(f, 4)}))
	pv := &Vote{Term: 3, IssuedAt: wireTime, Voter: testID(f, 3), Coordinator: testID(f, 4), Evidence: []byte("evidence"),
		Parent: ClaimParent{Term: 2, Coordinator: testID(f, 5), Seq: 7}}
	f.Add(mustMarshal(f, pv))
	f.Add([]byte{byte(TypeHeartbeat), WireVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, v, err := DecodeElection(b)
		if err != nil {
			return
		}
		var again []byte
		if c != nil {
			again, err = c.Marshal()
		} else {
			again, err = v.Marshal()
		}
		if err != nil {
			t.Fatalf("decoded message does not re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
	})
}

func FuzzDecodePresence(f *testing.F) {
	f.Add(mustMarshal(f, &PresenceMsg{IssuedAt: wireTime, Capability: []byte("sealed capability")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePresence(b)
		if err != nil {
			return
		}
		again, err := p.Marshal()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding: %v\n in %x\nout %x", err, b, again)
		}
		// The capability inside is hostile too: opening it must not panic.
		_, _ = hpeer.OpenCapability(p.Capability)
	})
}

func FuzzDecodeJob(f *testing.F) {
	f.Add(mustMarshal(f, &JobMsg{Term: 2, IssuedAt: wireTime, Payload: []byte("job")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := DecodeJob(b)
		if err != nil {
			return
		}
		again, err := j.Marshal()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding: %v\n in %x\nout %x", err, b, again)
		}
	})
}
