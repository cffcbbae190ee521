package pipeline

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
)

func TestServeMsgRoundTrip(t *testing.T) {
	big := serveMsg{Kind: serveBatch, Frame: 1 << 40, Lane: 3}
	for i := range maxSeqsPerFrame {
		big.Seqs = append(big.Seqs, seqEntry{ID: maxSeqID - uint64(i), Pos: 1 << 17, N: 1 << 17, First: 1 << 16})
	}
	for _, m := range []serveMsg{
		{Kind: serveBatch, Frame: 1, Seqs: []seqEntry{{ID: 1, Pos: 0, N: 5, First: 5}}},
		{Kind: serveBatch, Frame: 9, Lane: 1, Seqs: []seqEntry{{ID: 4, Pos: 7, N: 1, First: 1}, {ID: 2, Pos: 0, N: 9, First: 3}}},
		{Kind: serveDrop, Frame: 0, Lane: 2, Seqs: []seqEntry{{ID: 77}}},
		big,
	} {
		b, err := encodeServeMsg(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > wire.MaxControlPayload {
			t.Fatalf("%d-byte message exceeds a control frame", len(b))
		}
		got, err := decodeServeMsg(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
		}
	}
}

func TestServeMsgRefused(t *testing.T) {
	ok, _ := encodeServeMsg(serveMsg{Kind: serveBatch, Frame: 1, Seqs: []seqEntry{{ID: 1, N: 2, First: 2}}})
	cases := map[string][]byte{
		"empty":          nil,
		"not serve":      {msgCtl, 1, 1},
		"version":        {msgServe, 2, serveBatch, 1, 0, 1, 1, 0, 1, 1},
		"kind":           {msgServe, 1, 9, 1, 0, 1, 1},
		"no sequences":   {msgServe, 1, serveBatch, 1, 0, 0},
		"too many":       {msgServe, 1, serveBatch, 1, 0, 0x81, 0x01},
		"truncated":      ok[:len(ok)-1],
		"trailing":       append(bytes.Clone(ok), 0),
		"zero tokens":    {msgServe, 1, serveBatch, 1, 0, 1, 1, 0, 0, 0},
		"first > n":      {msgServe, 1, serveBatch, 1, 0, 1, 1, 0, 2, 3},
		"duplicate id":   {msgServe, 1, serveDrop, 1, 0, 2, 5, 5},
		"huge pos":       {msgServe, 1, serveBatch, 1, 0, 1, 1, 0xff, 0xff, 0xff, 0x7f, 1, 1},
		"lane too large": {msgServe, 1, serveDrop, 1, 0xff, 0xff, 0x7f, 1, 1},
	}
	for name, b := range cases {
		if _, err := decodeServeMsg(b); !errors.Is(err, errServeMsg) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSeqEntryCalls(t *testing.T) {
	for _, tc := range []struct {
		e     seqEntry
		calls []int
		last  int
	}{
		{seqEntry{N: 5, First: 5}, []int{5}, 5},
		{seqEntry{N: 1, First: 1}, []int{1}, 1},
		{seqEntry{N: 8, First: 5}, []int{5, 1, 1, 1}, 1},
	} {
		if got := tc.e.calls(); !reflect.DeepEqual(got, tc.calls) || tc.e.lastCall() != tc.last {
			t.Errorf("%+v: calls %v last %d", tc.e, got, tc.e.lastCall())
		}
	}
}

// FuzzServeMsg: the decoder never panics, and whatever it accepts
// encodes back to the same bytes.
func FuzzServeMsg(f *testing.F) {
	for _, m := range []serveMsg{
		{Kind: serveBatch, Frame: 3, Lane: 1, Seqs: []seqEntry{{ID: 1, N: 4, First: 2}, {ID: 9, Pos: 4, N: 1, First: 1}}},
		{Kind: serveDrop, Seqs: []seqEntry{{ID: 5}}},
	} {
		b, _ := encodeServeMsg(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeServeMsg(b)
		if err != nil {
			return
		}
		again, err := encodeServeMsg(m)
		if err != nil {
			t.Fatalf("accepted %x but cannot encode it: %v", b, err)
		}
		if !bytes.Equal(again, b) {
			// Uvarints have one shortest form; a longer one decodes but
			// does not round-trip. That is harmless, but the fields must.
			m2, err := decodeServeMsg(again)
			if err != nil || !reflect.DeepEqual(m, m2) {
				t.Fatalf("%x decodes to %+v, re-encodes to %+v", b, m, m2)
			}
		}
	})
}

// FuzzDecodeWeights: a weights blob from the network either builds the
// stage or is refused; it never panics.
func FuzzDecodeWeights(f *testing.F) {
	cfg := model.Config{Vocab: 16, Dim: 8, Layers: 2, Heads: 2, KVHeads: 1, FFNDim: 8, MaxSeq: 8}
	span := model.Span{First: 1, Last: 2}
	st, err := model.NewStage(cfg, span)
	if err != nil {
		f.Fatal(err)
	}
	good, err := encodeWeights(st)
	st.Close()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	be, err := tensor.Open("cpu")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeWeights(bytesReader(b), cfg, span, be)
		if err == nil {
			st.Close()
		}
	})
}

// TestDecodeWeightsKeepsBF16: weights that arrive as bfloat16 build a
// stage that holds its matrices in bfloat16 (2 bytes per parameter);
// float32 weights build a float32 stage.
func TestDecodeWeightsKeepsBF16(t *testing.T) {
	cfg := model.Config{Vocab: 16, Dim: 8, Layers: 2, Heads: 2, KVHeads: 1, FFNDim: 8, MaxSeq: 8}
	span := model.Span{First: 1, Last: 2}
	st, err := model.NewStage(cfg, span)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	be, err := tensor.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dt   safetensors.DType
		want tensor.DType
	}{{safetensors.F32, tensor.Float32}, {safetensors.BF16, tensor.BFloat16}} {
		var ts []safetensors.Tensor
		for _, x := range st.Tensors() {
			ts = append(ts, safetensors.Tensor(x))
		}
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, ts, nil, safetensors.WithDType(tc.dt)); err != nil {
			t.Fatal(err)
		}
		got, err := decodeWeights(bytesReader(buf.Bytes()), cfg, span, be)
		if err != nil {
			t.Fatal(err)
		}
		if got.WeightDType() != tc.want {
			t.Fatalf("%s weights: the stage holds %v, want %v", tc.dt, got.WeightDType(), tc.want)
		}
		got.Close()
	}
}
