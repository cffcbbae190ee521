// Package pipeline runs a training job across the swarm: the Driver on the
// researcher's node and a Worker on each stage node, joined by the
// encrypted links of package wire.
//
// # Shape of a run
//
// The researcher's node keeps the embedding (the pipeline's first stage)
// and the final norm, head and loss (its last stage), so tokens and labels
// never leave it. The blocks live on stage nodes named by the signed plan.
// Activations flow researcher → stage 0 → … → stage n−1 → researcher and
// their gradients flow back. Every link is opened by its upstream end,
// except that the researcher always opens its links to stage 0; a stage
// that is not next to the researcher also opens a "home" link to it. Every
// stage thus holds one link to the researcher, which carries control
// messages and weights and tells the researcher at once when a stage dies.
//
// Microbatch m of a step goes through replica m mod r of each stage, so a
// backward frame retraces its forward path. Stages are reactive: they run
// whatever frame arrives, in arrival order. The driver keeps at most
// stages+1 microbatches in flight, which gives the 1F1B order and bounds
// the activations each stage holds.
//
// # A step
//
//  1. The driver feeds the step's microbatches and collects their losses;
//     the stages run forward and backward as frames arrive.
//  2. Replicas of a stage send their gradients to the driver, which sums
//     them and sends the sum back (researchers own their model; they may
//     see its gradients).
//  3. The driver asks every stage for Σg² of its gradients, adds its own,
//     and sends apply{step, lr, clip scale}; each stage applies AdamW once
//     and acknowledges.
//
// # Exactly once
//
// Steps are numbered. A stage applies step k only when its last applied
// step is k−1; a repeated apply is acknowledged without effect. At each
// checkpoint the driver collects every stage's shard (parameters and
// optimizer state). When a stage node dies, the driver aborts the step in
// flight, the coordinator re-places the stage, every stage is restored to
// the last checkpoint, and training resumes after it. Every node appends
// apply and rollback events to a step log; replaying it gives each
// committed step exactly once.
package pipeline
