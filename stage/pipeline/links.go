package pipeline

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// WireJob names the links of one placement of a job: the hash of the job
// id and the plan's Gen, so the links of a replaced placement can never be
// mistaken for the new one's.
func WireJob(jobID string, gen uint64) wire.JobID {
	h := sha256.New()
	h.Write([]byte("holopeer-links-v1:"))
	h.Write([]byte(jobID))
	var g [8]byte
	binary.BigEndian.PutUint64(g[:], gen)
	h.Write(g[:])
	id, _ := wire.JobIDFromHash(h.Sum(nil))
	return id
}

// role is what one peer is to another in a plan.
type role struct {
	upstream   bool // the remote sends us activations (and takes our gradients)
	downstream bool // we send the remote activations
	home       bool // the remote is the researcher (control and weights)
}

// roleOf says what remote is to local in plan p. ok is false when the two
// have no link.
func roleOf(p *job.Plan, local, remote string) (r role, ok bool) {
	if local == remote {
		return r, false
	}
	prevOf := func(id string) []string {
		if id == p.Researcher {
			return p.Stages[len(p.Stages)-1].Replicas
		}
		_, prev, _, _ := p.Neighbours(id)
		return prev
	}
	nextOf := func(id string) []string {
		if id == p.Researcher {
			return p.Stages[0].Replicas
		}
		_, _, next, _ := p.Neighbours(id)
		return next
	}
	if local != p.Researcher && p.StageOf(local) < 0 {
		return r, false
	}
	r.upstream = slices.Contains(prevOf(local), remote)
	r.downstream = slices.Contains(nextOf(local), remote)
	r.home = remote == p.Researcher || local == p.Researcher && p.StageOf(remote) >= 0
	return r, r.upstream || r.downstream || r.home
}

// opener says whether local opens the link to remote: the upstream end
// opens, the researcher always opens to stage 0 (which matters when one
// stage is both first and last), and a stage opens its home link.
func opener(p *job.Plan, local, remote string) bool {
	if local == p.Researcher {
		return p.StageOf(remote) == 0
	}
	if remote == p.Researcher {
		return p.StageOf(local) != 0
	}
	r, _ := roleOf(p, local, remote)
	return r.downstream
}

// linkSpec is what local accepts from remote in plan p.
func linkSpec(p *job.Plan, c codec.Codec, local, remote string) (wire.LinkSpec, error) {
	r, ok := roleOf(p, local, remote)
	if !ok {
		return wire.LinkSpec{}, fmt.Errorf("%w: %s has no link with %s in job %s", wire.ErrNotAuthorized, short(remote), short(local), p.JobID)
	}
	var accept wire.KindSet
	if r.upstream {
		accept |= wire.Kinds(wire.KindForward)
	}
	if r.downstream {
		accept |= wire.Kinds(wire.KindBackward)
	}
	spec := wire.LinkSpec{
		Codec:     c,
		Accept:    accept,
		Tokens:    p.Spec.MicrobatchTokens(),
		FirstStep: p.StartStep,
	}
	if p.Spec.Kind == job.KindTrain {
		spec.Microbatches = uint32(p.Spec.Microbatches)
	} else {
		spec.Tokens, spec.MaxTokens = 0, p.Spec.MaxBatch*p.Spec.MaxTokens
		spec.StepsAhead = 1 << 40 // serving steps are request sequence numbers
	}
	return spec, nil
}

// newCodec builds the job's codec (and the subspace basis it needs).
func newCodec(s job.Spec) (codec.Codec, *subspace.Basis, error) {
	id, err := codec.ParseID(s.Codec)
	if err != nil {
		return nil, nil, err
	}
	var basis *subspace.Basis
	if bc, ok := s.Model.Basis(); ok {
		if basis, err = subspace.New(bc); err != nil {
			return nil, nil, err
		}
	}
	c, err := codec.New(id, codec.Params{Dim: s.Model.Dim, Basis: basis})
	return c, basis, err
}

// linkEvent is what a link's reader hands the owner loop: a frame (a
// control message decoded, a blob assembled) or the error that ended it.
type linkEvent struct {
	from  peer.ID
	link  *wire.Link
	frame wire.Frame
	ctl   *Ctl
	blob  []byte
	file  string // a spooled blob: the owner consumes and removes it
	err   error
}

// blobRule says how a link's reader takes a blob announced by hdr: at most
// limit bytes, into a file under spool when spool is set (a shard, a
// stage's weights: never whole in memory), else into memory.
type blobRule func(hdr Ctl) (limit int64, spool string)

// inMemory takes every blob into memory, at most limit bytes.
func inMemory(limit int64) blobRule {
	return func(Ctl) (int64, string) { return limit, "" }
}

// readLink forwards a link's frames to out until the link ends, then sends
// its error. Blobs are assembled here so that the owner sees one event.
func readLink(ctx context.Context, l *wire.Link, out chan<- linkEvent, rule blobRule) {
	from := l.RemotePeer()
	send := func(ev linkEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		f, err := l.Recv(ctx)
		if err != nil {
			send(linkEvent{from: from, link: l, err: err})
			return
		}
		ev := linkEvent{from: from, link: l, frame: f}
		if f.Kind == wire.KindControl {
			if ev.ctl, ev.blob, ev.file, err = readCtl(ctx, l, f, rule); err != nil {
				l.Close()
				send(linkEvent{from: from, link: l, err: err})
				return
			}
		}
		if !send(ev) {
			if ev.file != "" {
				os.Remove(ev.file)
			}
			return
		}
	}
}

// readCtl decodes control frame f and, for a blob, receives the blob that
// follows it on l as rule says: into memory, or into a spool file whose
// path it returns.
func readCtl(ctx context.Context, l frameLink, f wire.Frame, rule blobRule) (c *Ctl, blob []byte, file string, err error) {
	ctl, err := decodeCtl(f.Control)
	if err != nil {
		return nil, nil, "", err
	}
	if ctl.Op == opBlobEnd {
		return nil, nil, "", errors.New("pipeline: a blob's end without its start")
	}
	if ctl.Op != opBlob {
		return &ctl, nil, "", nil
	}
	limit, spool := rule(ctl)
	if spool == "" {
		blob, err = recvBlob(ctx, l, ctl, limit)
		return &ctl, blob, "", err
	}
	file, err = spoolBlob(ctx, l, ctl, limit, spool)
	return &ctl, nil, file, err
}

// spoolBlob receives a blob into a new file under dir, synced, and
// returns its path; on any error the file is removed.
func spoolBlob(ctx context.Context, l frameLink, hdr Ctl, limit int64, dir string) (path string, err error) {
	if err := checkBlob(hdr, limit); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("pipeline: spool blob %q: %w", hdr.Name, err)
	}
	f, err := os.CreateTemp(dir, "blob-*")
	if err != nil {
		return "", fmt.Errorf("pipeline: spool blob %q: %w", hdr.Name, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("pipeline: spool blob %q: %w", hdr.Name, cerr)
		}
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if err := recvBlobTo(ctx, l, hdr, limit, w); err != nil {
		return "", err
	}
	if err := w.Flush(); err != nil {
		return "", fmt.Errorf("pipeline: spool blob %q: %w", hdr.Name, err)
	}
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("pipeline: spool blob %q: %w", hdr.Name, err)
	}
	return f.Name(), nil
}

// errLinkLost marks a neighbour link that ended.
var errLinkLost = errors.New("pipeline: link lost")

func short(id string) string {
	if len(id) > 16 {
		return id[:6] + "…" + id[len(id)-6:]
	}
	return id
}

func toInt32(ids []int) []int32 {
	if ids == nil {
		return nil
	}
	out := make([]int32, len(ids))
	for i, v := range ids {
		out[i] = int32(v)
	}
	return out
}

func toInt(ids []int32) []int {
	if ids == nil {
		return nil
	}
	out := make([]int, len(ids))
	for i, v := range ids {
		out[i] = int(v)
	}
	return out
}
