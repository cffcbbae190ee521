package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
	"github.com/holopeer/holopeer/stage/wire/netem"
	"github.com/holopeer/holopeer/stage/wire/wirebench"
)

// The wire group measures the stage data path: goodput of the encrypted
// stage stream against raw TCP on loopback, bytes per token per boundary
// for every codec against bf16, the codecs' cost against the demo stage's
// compute, and (as root) tokens/s across an emulated 80 Mbit/s, 40 ms home
// link, subspace against bf16.
func init() {
	registerBench(benchGroup{Name: "wire", Run: benchWire})
	register(newWireNetemPeerCmd)
}

func benchWire(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	gopts := wire.GoodputOptions{Duration: o.Time / 2}
	if o.Quick {
		gopts = wire.GoodputOptions{Duration: 300 * time.Millisecond, Rounds: 2, FrameBytes: 1 << 20}
	}
	g, err := wire.MeasureGoodput(ctx, gopts)
	if err != nil {
		return fmt.Errorf("goodput: %w", err)
	}
	r := row("wire_goodput_noise_stream_MBps", g.StreamMBps, "MB/s", g.TCPMBps)
	r.Note = fmt.Sprintf("Noise_XX records inside a libp2p stream (%s, yamux, TCP) on loopback; baseline: raw TCP socket, same bytes, same process; ratio is stream/TCP", g.Security)
	emit(r)
	r = row("wire_noise_record_layer_MBps", g.RecordLayerMBps, "MB/s", g.TCPMBps)
	r.Note = "Noise records sealed and opened in memory on every core, no network: the ceiling of the stream above (both ends share these cores); baseline raw TCP, so this ratio bounds the stream's"
	emit(r)
	r = row("wire_goodput_fp32_link_MBps", g.LinkFP32MBps, "MB/s", g.TCPMBps)
	r.Note = "Link.Send/Recv of fp32 tensors (stream plus codec); baseline raw TCP"
	emit(r)

	const tokens = 512
	table, err := wirebench.BytesPerToken(tokens)
	if err != nil {
		return err
	}
	for _, t := range table {
		for _, dir := range []struct {
			name    string
			v, base float64
		}{{"fwd", t.Forward, t.BF16Forward}, {"bwd", t.Backward, t.BF16Backward}} {
			r := row(fmt.Sprintf("wire_bytes_per_token_%s_%s_d%d", dir.name, t.Codec, t.Dim), dir.v, "B/token", dir.base)
			r.Note = fmt.Sprintf("on the stream, %d-token frames; baseline bf16", tokens)
			if t.Rank > 0 {
				r.Note += fmt.Sprintf("; k=%d", t.Rank)
			}
			emit(r)
		}
	}

	minTime := o.Time / 4
	if o.Quick {
		minTime = 0
	}
	over, err := wirebench.CodecOverhead(ctx, minTime)
	if err != nil {
		return err
	}
	demoCodec := codec.SubspaceBF16
	for _, ov := range over {
		r := row(fmt.Sprintf("wire_codec_ns_per_token_%s", ov.Codec), ov.CodecNsPerToken, "ns/token", ov.StageNsPerToken)
		r.Note = "encode+decode forward and backward, demo d=128 k=32, 512-token microbatch; baseline: the demo's middle stage forward+backward per token; ratio is the fraction"
		emit(r)
		if ov.Codec == demoCodec {
			r := row("wire_codec_overhead_fraction", ov.Fraction, "fraction", 0)
			r.Note = "subspace-bf16 encode+decode per token / demo middle-stage compute per token (testnet/demo.yaml)"
			emit(r)
		}
	}

	return benchNetem(ctx, o, emit)
}

func benchNetem(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	if err := netem.Available(); err != nil {
		r := row("wire_netem_skipped", 0, "", 0)
		r.Note = err.Error()
		emit(r)
		return nil
	}
	link, err := netem.Setup(ctx, netem.Config{})
	if errors.Is(err, netem.ErrUnavailable) {
		r := row("wire_netem_skipped", 0, "", 0)
		r.Note = err.Error()
		emit(r)
		return nil
	}
	if err != nil {
		return err
	}
	defer link.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dur := 5 * time.Second
	if o.Quick {
		dur = 2 * time.Second
	}
	d := wirebench.Demo.Model
	res := map[codec.ID]netem.Result{}
	for _, id := range []codec.ID{codec.BF16, codec.SubspaceBF16} {
		run := netem.Run{Codec: id, Dim: d.Dim, Rank: d.Subspace.Rank, Vocab: d.Vocab, Seed: d.Subspace.Seed,
			Tokens: wirebench.Demo.Batch * wirebench.Demo.Seq, Duration: dur}
		if res[id], err = link.Measure(ctx, []string{exe, wireNetemPeerCmd}, run); err != nil {
			return fmt.Errorf("netem %s: %w", id, err)
		}
	}
	for _, id := range []codec.ID{codec.BF16, codec.SubspaceBF16} {
		r := row("wire_netem_tokens_per_s_"+id.String(), res[id].TokensPerSec, "tokens/s", res[codec.BF16].TokensPerSec)
		r.Note = fmt.Sprintf("one boundary, 80 Mbit/s and 20 ms each way (%s), demo d=%d k=%d, %.1f B/token on the stream; baseline bf16",
			link.Mode, d.Dim, d.Subspace.Rank, res[id].BytesPerToken)
		emit(r)
	}
	return nil
}

// wireNetemPeerCmd is the hidden subcommand the netem bench runs inside
// each network namespace.
const wireNetemPeerCmd = "wire-netem-peer"

func newWireNetemPeerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    wireNetemPeerCmd,
		Short:  "internal: one end of the wire bench's emulated link",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return netem.PeerMain(cmd.Context(), cmd.OutOrStdout())
		},
	}
}
