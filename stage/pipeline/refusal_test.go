package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/pipeline/pipelinetest"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

func smallSpec(name string, layers, dim int, steps int) job.Spec {
	return job.Spec{
		JobID: job.NewJobID(name), Name: name, Kind: job.KindTrain,
		Model:    model.Config{Vocab: 257, Dim: dim, Layers: layers, Heads: 4, KVHeads: 2, FFNDim: 2 * dim, MaxSeq: 16},
		InitSeed: 1, Codec: "fp32", Stages: 2, Replicas: 1,
		Steps: steps, SeqLen: 16, Rows: 2, Microbatches: 2,
		Optim: optim.DefaultConfig(), Schedule: optim.Schedule{Peak: 1e-3, Total: steps},
	}
}

func source() (data.Source, error) { return data.NewSynthetic(data.DefaultSyntheticConfig()) }

// TestRefusals: a job that asks for more memory than the swarm lends and a
// stage link from a peer outside the plan are each refused with a clear
// error, and the swarm goes on training another job meanwhile.
func TestRefusals(t *testing.T) {
	sw, err := pipelinetest.New(3, pipelinetest.Options{Memory: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Too big: 2 stages of a d=1024, 16-layer model need far more than
	// 256 MiB each.
	big := smallSpec("big", 16, 1024, 2)
	d, err := sw.Researcher().NewDriver(pipeline.DriverConfig{Spec: big, NewSource: source}, sw.Client())
	if err != nil {
		t.Fatal(err)
	}
	err = d.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "does not offer enough") {
		t.Fatalf("oversized job: %v", err)
	}
	t.Logf("oversized job refused: %v", err)

	// A job that fits runs while a peer outside its plan tries to link
	// with one of its stages.
	ok := smallSpec("ok", 2, 32, 6)
	var plan *job.Plan
	intruded := make(chan error, 1)
	d, err = sw.Researcher().NewDriver(pipeline.DriverConfig{Spec: ok, NewSource: source, Progress: func(p pipeline.Progress) {
		if p.Step != 2 || plan != nil {
			return
		}
		plan = p.Plan
		go func() { intruded <- intrude(ctx, sw, p.Plan) }()
	}}, sw.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(ctx); err != nil {
		t.Fatalf("the job that fits failed: %v", err)
	}
	if err := <-intruded; !errors.Is(err, wire.ErrNotAuthorized) {
		t.Fatalf("intruder's link: got %v, want a not-authorized refusal", err)
	}
}

// intrude opens a stage link to stage 0 of a running job from a fresh
// host that the plan does not name.
func intrude(ctx context.Context, sw *pipelinetest.Loopback, p *job.Plan) error {
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableMetrics())
	if err != nil {
		return err
	}
	defer h.Close()
	target, err := peer.Decode(p.Stages[0].Replicas[0])
	if err != nil {
		return err
	}
	for _, o := range sw.Hosts {
		if o.ID() == target {
			h.Peerstore().AddAddrs(target, o.Addrs(), time.Hour)
		}
	}
	c, err := codec.New(codec.FP32, codec.Params{Dim: p.Spec.Model.Dim})
	if err != nil {
		return err
	}
	// The intruder's own side claims the link; the stage node's plan does
	// not.
	auth := wire.AuthorizerFunc(func(context.Context, wire.JobID, peer.ID) (wire.LinkSpec, error) {
		return wire.LinkSpec{Codec: c, Accept: wire.Kinds(wire.KindBackward)}, nil
	})
	svc, err := wire.NewService(h, auth)
	if err != nil {
		return err
	}
	defer svc.Close()
	l, err := svc.OpenLink(ctx, target, pipeline.WireJob(p.JobID, p.Gen))
	if err == nil {
		l.Close()
		return errors.New("the stage node accepted a link from outside the plan")
	}
	return err
}
