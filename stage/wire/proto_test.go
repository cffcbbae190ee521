package wire

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/flynn/noise"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

func TestReadFrameHeader(t *testing.T) {
	good := header{Version: ProtocolVersion, Kind: KindForward, Codec: codec.BF16, Job: testJob, Step: 7, Micro: 1, Rows: 4, Cols: 64, Length: 512}
	for _, tc := range []struct {
		name string
		mod  func(b []byte)
		want error
	}{
		{"valid", func([]byte) {}, nil},
		{"zero length payload of a tensor frame", func(b []byte) { binary.BigEndian.PutUint64(b[40:], 0) }, nil}, // the spec catches it
		{"payload at the frame limit", func(b []byte) { binary.BigEndian.PutUint64(b[40:], MaxFramePayload) }, nil},
		{"payload one past the frame limit", func(b []byte) { binary.BigEndian.PutUint64(b[40:], MaxFramePayload+1) }, ErrTooLarge},
		{"payload length 2^64-1", func(b []byte) { binary.BigEndian.PutUint64(b[40:], ^uint64(0)) }, ErrTooLarge},
		{"version 0", func(b []byte) { b[0] = 0 }, ErrMalformed},
		{"version 2", func(b []byte) { b[0] = 2 }, ErrMalformed},
		{"reserved byte set", func(b []byte) { b[3] = 1 }, ErrMalformed},
		{"kind 0", func(b []byte) { b[1] = 0 }, ErrUnexpectedKind},
		{"kind 5", func(b []byte) { b[1] = 5 }, ErrUnexpectedKind},
		{"kind 255", func(b []byte) { b[1] = 255 }, ErrUnexpectedKind},
		{"unknown codec", func(b []byte) { b[2] = 6 }, ErrMalformed},
		{"codec none on a tensor", func(b []byte) { b[2] = 0 }, ErrMalformed},
		{"zero rows", func(b []byte) { binary.BigEndian.PutUint32(b[32:], 0) }, ErrShape},
		{"zero cols", func(b []byte) { binary.BigEndian.PutUint32(b[36:], 0) }, ErrShape},
		{"control with a shape", func(b []byte) { b[1] = byte(KindControl); b[2] = 0 }, ErrMalformed},
		{"control at its limit", func(b []byte) {
			b[1], b[2] = byte(KindControl), 0
			binary.BigEndian.PutUint64(b[32:], 0)
			binary.BigEndian.PutUint64(b[40:], MaxControlPayload)
		}, nil},
		{"control one past its limit", func(b []byte) {
			b[1], b[2] = byte(KindControl), 0
			binary.BigEndian.PutUint64(b[32:], 0)
			binary.BigEndian.PutUint64(b[40:], MaxControlPayload+1)
		}, ErrTooLarge},
		{"error frame one past its limit", func(b []byte) {
			b[1], b[2] = byte(KindError), 0
			binary.BigEndian.PutUint64(b[32:], 0)
			binary.BigEndian.PutUint64(b[40:], 2+MaxErrorMessage+1)
		}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, HeaderSize)
			good.encode(b)
			tc.mod(b)
			_, err := decodeHeader(b)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("decodeHeader = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := decodeHeader(make([]byte, HeaderSize-1)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short header: %v", err)
	}
}

func TestSpecCheckTable(t *testing.T) {
	c := mustCodec(t, codec.FP32, 64, nil)
	spec, err := LinkSpec{Codec: c, Accept: Kinds(KindForward), MaxTokens: 16, Microbatches: 2, FirstStep: 10, StepsAhead: 2}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	base := header{Version: ProtocolVersion, Kind: KindForward, Codec: codec.FP32, Job: testJob, Step: 10, Rows: 16, Cols: 64, Length: 16 * 64 * 4}
	for _, tc := range []struct {
		name string
		mod  func(h *header)
		want error
	}{
		{"max tokens", func(*header) {}, nil},
		{"one token", func(h *header) { h.Rows, h.Length = 1, 256 }, nil},
		{"one past max tokens", func(h *header) { h.Rows, h.Length = 17, 17*256 }, ErrShape},
		{"length one short", func(h *header) { h.Length-- }, ErrShape},
		{"step before the first", func(h *header) { h.Step = 9 }, ErrStep},
		{"step at the window's end", func(h *header) { h.Step = 12 }, nil},
		{"step past the window", func(h *header) { h.Step = 13 }, ErrStep},
		{"last microbatch", func(h *header) { h.Micro = 1 }, nil},
		{"microbatch past the step", func(h *header) { h.Micro = 2 }, ErrStep},
		{"backward not accepted", func(h *header) { h.Kind = KindBackward }, ErrUnexpectedKind},
		{"wrong job", func(h *header) { h.Job = JobID{} }, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := base
			tc.mod(&h)
			var w stepWindow
			err := spec.checkHeader(&h, testJob, &w)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("checkHeader = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := (LinkSpec{Codec: c, MaxTokens: maxTokensLimit + 1}).withDefaults(); err == nil {
		t.Fatal("a spec past the token limit was accepted")
	}
	if _, err := (LinkSpec{Codec: mustCodec(t, codec.FP32, 16384, nil), MaxTokens: 8192}).withDefaults(); err == nil {
		t.Fatal("a spec whose frames exceed MaxFramePayload was accepted")
	}
}

func TestRecordWriterSplitsAtTheNoiseLimit(t *testing.T) {
	send, recv := sessionPair(t)
	var buf bytes.Buffer
	w := newRecordWriter(send, &buf, nil)
	if err := w.seal(make([]byte, MaxRecordPlaintext+1)); err == nil {
		t.Fatal("seal accepted a record past 65535 bytes")
	}
	payload := make([]byte, 3*MaxRecordPlaintext+5)
	rand.Read(payload)
	h := header{Version: ProtocolVersion, Kind: KindForward, Codec: codec.FP32, Rows: 1, Cols: 1, Job: testJob, Length: uint64(len(payload))}
	if err := w.writeFrame(&h, payload); err != nil {
		t.Fatal(err)
	}
	// Every record's length is within the Noise limit.
	raw := buf.Bytes()
	var records int
	for off := 0; off < len(raw); records++ {
		l := int(binary.BigEndian.Uint16(raw[off:]))
		if l > MaxRecord || l < TagSize {
			t.Fatalf("record %d has length %d", records, l)
		}
		off += 2 + l
	}
	if records != 4 {
		t.Fatalf("%d records, want 4", records)
	}
	r := newRecordReader(recv, bytes.NewReader(raw), nil)
	_, got, err := r.readFrame(func(*header) error { return nil }, func(n int) ([]byte, error) { return make([]byte, n), nil })
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("read back: %v", err)
	}
	if _, _, err := r.readFrame(func(*header) error { return nil }, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("after the frame: %v, want EOF", err)
	}
}

// sessionPair runs a real XX handshake over an in-memory pipe and returns
// the initiator's send state and the responder's receive state.
func sessionPair(t testing.TB) (*noise.CipherState, *noise.CipherState) {
	t.Helper()
	ki, _, _ := crypto.GenerateEd25519Key(nil)
	kr, _, _ := crypto.GenerateEd25519Key(nil)
	pi, _ := peer.IDFromPrivateKey(ki)
	pr, _ := peer.IDFromPrivateKey(kr)
	idI, err := newIdentity(ki, nil)
	if err != nil {
		t.Fatal(err)
	}
	idR, err := newIdentity(kr, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := pipeConn()
	var fp [32]byte
	type res struct {
		s   session
		err error
	}
	done := make(chan res, 1)
	go func() {
		if _, err := readPreamble(b); err != nil {
			done <- res{err: err}
			return
		}
		s, err := handshake(b, false, idR, pr, pi, testJob, fp)
		done <- res{s, err}
	}()
	si, err := handshake(a, true, idI, pi, pr, testJob, fp)
	if err != nil {
		t.Fatal(err)
	}
	rr := <-done
	if rr.err != nil {
		t.Fatal(rr.err)
	}
	return si.send, rr.s.recv
}

type duplex struct {
	io.Reader
	io.Writer
}

func pipeConn() (io.ReadWriter, io.ReadWriter) {
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	return duplex{ar, aw}, duplex{br, bw}
}

func TestHandshakePayloadRoundTrip(t *testing.T) {
	k, _, _ := crypto.GenerateEd25519Key(nil)
	id, err := newIdentity(k, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp := [32]byte{1, 2, 3}
	p, err := unmarshalHandshakePayload(id.payload(fp))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.IdentityKey, id.pubKey) || !bytes.Equal(p.Signature, id.signature) || p.Fingerprint != fp {
		t.Fatal("payload fields changed in the round trip")
	}
	pid, _ := peer.IDFromPrivateKey(k)
	if err := verifyPeer(id.payload(fp), pid, id.static.Public, fp); err != nil {
		t.Fatal(err)
	}
	good := id.payload(fp)
	for name, b := range map[string][]byte{
		"empty":           nil,
		"trailing byte":   append(bytes.Clone(good), 0),
		"truncated":       good[:len(good)-1],
		"flags":           append([]byte{ProtocolVersion, 1}, good[2:]...),
		"zero key length": append([]byte{ProtocolVersion, 0, 0, 0}, good[4:]...),
		"key too long":    append([]byte{ProtocolVersion, 0, 0xff, 0xff}, good[4:]...),
	} {
		if _, err := unmarshalHandshakePayload(b); !errors.Is(err, ErrHandshake) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeHeader: any 48 bytes either fail with a coded error or decode
// to a header that encodes back to the same bytes.
func FuzzDecodeHeader(f *testing.F) {
	b := make([]byte, HeaderSize)
	(&header{Version: 1, Kind: KindForward, Codec: codec.SubspaceBF16, Rows: 512, Cols: 40, Length: 512 * 82}).encode(b)
	f.Add(b)
	(&header{Version: 1, Kind: KindError, Length: 10}).encode(b)
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := decodeHeader(in)
		if err != nil {
			var we *Error
			if !errors.As(err, &we) {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if h.Length > MaxFramePayload {
			t.Fatalf("accepted length %d", h.Length)
		}
		out := make([]byte, HeaderSize)
		h.encode(out)
		if !bytes.Equal(out, in[:HeaderSize]) {
			t.Fatalf("re-encoded %x, read %x", out, in[:HeaderSize])
		}
	})
}

// FuzzHandshakePayload: the payload decoder never panics, bounds its
// fields, and round-trips what it accepts; verifyPeer never accepts a
// payload not signed by the expected peer.
func FuzzHandshakePayload(f *testing.F) {
	k, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := newIdentity(k, nil)
	pid, _ := peer.IDFromPrivateKey(k)
	f.Add(id.payload([32]byte{}))
	f.Add([]byte{1, 0, 0, 1, 0, 0, 1, 0})
	other, _, _ := crypto.GenerateEd25519Key(nil)
	otherID, _ := peer.IDFromPrivateKey(other)
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := unmarshalHandshakePayload(in)
		if err != nil {
			return
		}
		if len(p.IdentityKey) > maxIdentityKey || len(p.Signature) > maxSignature {
			t.Fatal("field past its bound")
		}
		if !bytes.Equal(p.marshal(), in) {
			t.Fatal("accepted payload does not round-trip")
		}
		if verifyPeer(in, otherID, id.static.Public, p.Fingerprint) == nil {
			t.Fatal("a payload passed as another peer's")
		}
		_ = verifyPeer(in, pid, id.static.Public, p.Fingerprint)
	})
}

// FuzzReadFrame seals fuzzer-chosen plaintext records (each prefixed by a
// fuzzer-chosen length adjustment) and feeds them to the frame reader with
// a real spec: it must refuse or accept without panicking, and never ask
// for a buffer larger than the spec allows.
func FuzzReadFrame(f *testing.F) {
	c := mustCodec(f, codec.BF16, 64, nil)
	spec, err := LinkSpec{Codec: c, Accept: Kinds(KindForward, KindBackward), MaxTokens: 1024}.withDefaults()
	if err != nil {
		f.Fatal(err)
	}
	limit := c.PayloadSize(codec.Forward, 1024)
	hb := make([]byte, HeaderSize)
	(&header{Version: 1, Kind: KindForward, Codec: codec.BF16, Job: testJob, Rows: 600, Cols: 64, Length: 600 * 128}).encode(hb)
	f.Add(append(hb, make([]byte, 100)...), uint16(0), make([]byte, 200), uint16(0))
	f.Add(hb, uint16(3), []byte{1, 2, 3}, uint16(65535))
	f.Fuzz(func(t *testing.T, first []byte, adj1 uint16, second []byte, adj2 uint16) {
		// A fixed key stands in for a finished handshake: what is under
		// test is the reader's handling of what the session delivers.
		key := [32]byte{7}
		send := noise.UnsafeNewCipherState(cipherSuite, key, 0)
		recv := noise.UnsafeNewCipherState(cipherSuite, key, 0)
		var raw bytes.Buffer
		for _, rec := range []struct {
			pt  []byte
			adj uint16
		}{{first, adj1}, {second, adj2}} {
			if len(rec.pt) > MaxRecordPlaintext {
				rec.pt = rec.pt[:MaxRecordPlaintext]
			}
			ct, _ := send.Encrypt(nil, nil, rec.pt)
			l := uint16(len(ct))
			if rec.adj != 0 {
				l = rec.adj // a lying length prefix
			}
			raw.Write(binary.BigEndian.AppendUint16(nil, l))
			raw.Write(ct)
		}
		r := newRecordReader(recv, &raw, nil)
		var w stepWindow
		for range 3 {
			_, _, err := r.readFrame(func(h *header) error { return spec.checkHeader(h, testJob, &w) },
				func(n int) ([]byte, error) {
					if n > limit {
						t.Fatalf("asked for a %d-byte buffer, the spec allows %d", n, limit)
					}
					return make([]byte, n), nil
				})
			if err != nil {
				return
			}
		}
	})
}

// The record layer seals and opens a batch's records in parallel with
// explicit nonces; on the wire it must stay exactly what one noise
// CipherState used in order produces, in both directions, across batches.
func TestParallelRecordsAreSequentialNoiseOnTheWire(t *testing.T) {
	var key [32]byte
	rand.Read(key[:])
	state := func() *noise.CipherState { return noise.UnsafeNewCipherState(cipherSuite, key, 0) }
	payload := make([]byte, firstChunk+(2*batchRecords+3)*MaxRecordPlaintext+77) // three batches, the last short
	rand.Read(payload)
	frame := func(n int) header {
		return header{Version: ProtocolVersion, Kind: KindForward, Codec: codec.FP32, Rows: 1, Cols: 1, Job: testJob, Length: uint64(n)}
	}
	sizes := []int{len(payload), 100, len(payload)} // nonces must carry on from frame to frame

	// Parallel writer → sequential CipherState.
	var buf bytes.Buffer
	w := newRecordWriter(state(), &buf, nil)
	for _, n := range sizes {
		h := frame(n)
		if err := w.writeFrame(&h, payload[:n]); err != nil {
			t.Fatal(err)
		}
	}
	seq := state()
	raw, plain := buf.Bytes(), []byte{}
	for off := 0; off < len(raw); {
		l := int(binary.BigEndian.Uint16(raw[off:]))
		pt, err := seq.Decrypt(nil, nil, raw[off+2:off+2+l])
		if err != nil {
			t.Fatalf("record at byte %d does not open in order: %v", off, err)
		}
		plain = append(plain, pt...)
		off += 2 + l
	}
	if want := 3*HeaderSize + 2*len(payload) + 100; len(plain) != want {
		t.Fatalf("opened %d plaintext bytes, want %d", len(plain), want)
	}

	// Sequential CipherState → parallel reader, then a record tampered with
	// in the middle of a batch.
	enc := state()
	var wire []byte
	for _, n := range sizes {
		h := frame(n)
		first := make([]byte, HeaderSize+min(n, firstChunk))
		h.encode(first)
		copy(first[HeaderSize:], payload)
		recs := [][]byte{first}
		for i := 1; i < frameRecords(n); i++ {
			recs = append(recs, chunkOf(payload[:n], i))
		}
		for _, pt := range recs {
			wire = binary.BigEndian.AppendUint16(wire, uint16(len(pt)+TagSize))
			var err error
			if wire, err = enc.Encrypt(wire, nil, pt); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := newRecordReader(state(), bytes.NewReader(wire), nil)
	for _, n := range sizes {
		_, got, err := r.readFrame(func(*header) error { return nil }, func(n int) ([]byte, error) { return make([]byte, n), nil })
		if err != nil || !bytes.Equal(got, payload[:n]) {
			t.Fatalf("frame of %d bytes read back: %v", n, err)
		}
	}
	tampered := bytes.Clone(wire)
	tampered[HeaderSize+20*(recordPrefix+MaxRecord)] ^= 1 // inside record 20, the second batch
	r = newRecordReader(state(), bytes.NewReader(tampered), nil)
	_, _, err := r.readFrame(func(*header) error { return nil }, func(n int) ([]byte, error) { return make([]byte, n), nil })
	var we *Error
	if !errors.As(err, &we) || we.Code != CodeDecrypt {
		t.Fatalf("tampered record: %v, want a decrypt error", err)
	}
}
