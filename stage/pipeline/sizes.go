package pipeline

import (
	"os"
	"path/filepath"
	"time"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
)

// The sizes of what moves between the researcher and a stage node follow
// from the plan alone, so a receiver refuses a larger blob before it
// takes a byte of it, and the refusal names both sizes.

// headerSlack bounds a safetensors header (names, shapes, offsets and
// metadata of a stage's tensors).
const headerSlack = 1 << 20

// stageParams is the number of scalars stage holds in plan p.
func stageParams(p *job.Plan, stage int) int64 {
	sp := p.Stages[stage]
	return p.Spec.Model.SpanParams(model.Span{First: sp.First, Last: sp.Last})
}

// shardLimit bounds a training shard: fp32 weights and both AdamW moments.
func shardLimit(p *job.Plan, stage int) int64 { return 12*stageParams(p, stage) + headerSlack }

// weightsLimit bounds a stage's weights (fp32 on the wire).
func weightsLimit(p *job.Plan, stage int) int64 { return 4*stageParams(p, stage) + headerSlack }

// gradsLimit bounds a replica's gradients.
func gradsLimit(p *job.Plan, stage int) int64 { return 4*stageParams(p, stage) + headerSlack }

// Readiness waits for weights to move, so its deadline grows with them: a
// base for linking, plus the bytes at a slow WAN's rate. A node that is
// alive but starved is not taken for lost just because the model is big.
const (
	readyBase = time.Minute
	readyRate = 4 << 20 // bytes per second
)

// readyTimeout is the deadline for every stage of p to link and load when
// each must first receive its weights (weights), or only link.
func readyTimeout(set time.Duration, p *job.Plan, weights bool) time.Duration {
	if set > 0 {
		return set
	}
	if !weights {
		return 2 * time.Minute
	}
	var bytes int64
	for i, s := range p.Stages {
		bytes += weightsLimit(p, i) * int64(len(s.Replicas))
	}
	return readyBase + time.Duration(bytes/readyRate)*time.Second
}

// spoolDir is where this node's blobs of job jobID are received: under
// the data dir, or the system's temporary directory without one.
func (rt *Runtime) spoolDir(jobID string) string {
	base := rt.dir
	if base == "" {
		base = filepath.Join(os.TempDir(), "holopeer-"+rt.host.ID().String())
	}
	return filepath.Join(base, "jobs", jobID, "spool")
}
