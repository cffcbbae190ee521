package model_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
)

// FuzzStageInput feeds arbitrary shapes and values to the two stages of a
// tiny constrained model (what a peer could send) and requires an error or
// a finite result, never a panic or a microbatch left behind by a
// rejected call.
func FuzzStageInput(f *testing.F) {
	cfg := variants(2)["subspace"]
	spans, _ := model.EvenSpans(2, 2)
	stages, err := model.NewStages(cfg, spans)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(1), uint8(3), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, false)
	f.Add(uint8(2), uint8(2), []byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0xc0, 0x7f}, true)
	f.Add(uint8(0), uint8(200), []byte{}, false)
	f.Fuzz(func(t *testing.T, batch, seq uint8, data []byte, noGrad bool) {
		n := int(batch) * int(seq)
		word := func(i int) uint32 {
			if len(data) == 0 {
				return 0
			}
			var b [4]byte
			for j := range b {
				b[j] = data[(4*i+j)%len(data)]
			}
			return binary.LittleEndian.Uint32(b[:])
		}
		ids := make([]int32, min(n, 64))
		for i := range ids {
			ids[i] = int32(word(i)) % 20 // sometimes ≥ vocab 13 or negative
		}
		hidden := make([]float32, min(n*cfg.Dim, 4096))
		for i := range hidden {
			hidden[i] = math.Float32frombits(word(i))
		}
		in := model.Input{Batch: int(batch), Seq: int(seq), Tokens: ids, NoGrad: noGrad}
		if len(data) > 0 && data[0]&1 == 1 {
			in.Positions = ids
		}
		for si, s := range stages {
			if si == 1 {
				in.Hidden = hidden
				in.Targets = ids
			}
			out, err := s.Forward(0, in)
			if err != nil {
				if len(s.InFlight()) != 0 {
					t.Fatalf("stage %d: rejected input left a microbatch in flight", si)
				}
				continue
			}
			// Finite inputs near float32's limits may overflow on the way
			// (the next stage then rejects them); moderate ones must not.
			if moderate(hidden) {
				for _, v := range append(out.Hidden, out.Logits...) {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("stage %d: moderate input gave a non-finite output", si)
					}
				}
			}
			if noGrad {
				continue
			}
			var grad []float32
			if si == 0 {
				grad = hidden
			}
			if _, err := s.Backward(0, grad); err != nil {
				s.Drop(0)
			}
			if len(s.InFlight()) != 0 {
				t.Fatalf("stage %d: microbatch left in flight", si)
			}
		}
	})
}

func moderate(x []float32) bool {
	for _, v := range x {
		if !(math.Abs(float64(v)) < 1e4) {
			return false
		}
	}
	return true
}
