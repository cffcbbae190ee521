package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/pipeline/pipelinetest"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// serveTestModel fills m with weights of order one, its head favouring
// printable bytes, so generations are readable and differ by prompt.
func serveTestModel(t *testing.T, m *model.Model) {
	t.Helper()
	modeltest.Perturb(t, modeltest.Weights{Stream: 8, Norm: 0.2, Matrix: 0.5, PrintableHead: true}, m.Stage)
}

// serving is a serving manifest placed on a loopback swarm with its API.
type serving struct {
	base  string
	sv    *servePlan
	srv   *pipeline.Server
	swarm *pipelinetest.Loopback
	stop  func() // ends the API and the job; idempotent
}

// startServing resolves a serving manifest, places it on a loopback
// swarm and serves its API.
func startServing(t *testing.T, m *manifest.Manifest, stageNodes int) *serving {
	t.Helper()
	sv, err := prepareServe(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sv.ck.Close() })
	sw, err := pipelinetest.New(stageNodes, benchSwarmOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Close)
	srv, err := sw.Researcher().NewServer(pipeline.ServeConfig{Spec: sv.spec, Weights: sv.weights, Pseudonyms: sv.perm, Logger: quietLogger()}, sw.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if err := srv.Start(sctx); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveHTTP(ctx, srv, sv, serveOptions{HTTP: "127.0.0.1:0", Stdout: io.Discard, Logger: quietLogger(), Ready: func(u string) { ready <- u }})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer ccancel()
			srv.Close(cctx)
		})
	}
	t.Cleanup(stop)
	select {
	case u := <-ready:
		return &serving{base: u, sv: sv, srv: srv, swarm: sw, stop: stop}
	case err := <-done:
		t.Fatal(err)
	}
	return nil
}

func writeManifest(t *testing.T, dir, text string) *manifest.Manifest {
	t.Helper()
	p := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// streamCompletion posts a streaming completion and returns its text.
func streamCompletion(base, prompt string, n int) (string, error) {
	body := fmt.Sprintf(`{"model":"tiny","prompt":%q,"max_tokens":%d,"temperature":0,"stream":true}`, prompt, n)
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 {
			return "", fmt.Errorf("event %s: %v", data, err)
		}
		text.WriteString(c.Choices[0].Text)
	}
	if !done {
		return "", fmt.Errorf("stream ended without [DONE] after %q", text.String())
	}
	return text.String(), nil
}

// localText is the single-process greedy generation the API should match.
func localText(t *testing.T, st *model.Stage, prompt string, n int) string {
	t.Helper()
	local, err := serve.NewLocal(st)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	p := tokenizer.Byte().Encode(prompt)
	in := make([]int32, len(p))
	for i, id := range p {
		in[i] = int32(id)
	}
	err = local.Generate(context.Background(), in, n, serve.NewSampler(serve.Sampling{}).Pick, func(tok int32) bool {
		if tok == tokenizer.ByteEOS {
			return true
		}
		ids = append(ids, int(tok))
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return tokenizer.Byte().Decode(ids)
}

// TestServeHTTPThroughSwarm: a serving manifest placed on three stage
// nodes; ten streaming completions sent at once over HTTP all complete,
// each with the text one process generates from the checkpoint.
func TestServeHTTPThroughSwarm(t *testing.T) {
	dir := t.TempDir()
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 3, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 64}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	serveTestModel(t, m)
	checkpointtest.Save(t, filepath.Join(dir, "ckpt"), []*model.Stage{m.Stage}, checkpoint.WithTokenizer(tokenizer.Byte()))
	man := writeManifest(t, dir, `
name: tiny
tokenizer: byte
model: {checkpoint: ckpt}
pipeline: {stages: 3, codec: fp32}
serve: {max_prompt_tokens: 24, max_output_tokens: 24, max_batch: 4, max_queue: 16}
`)
	sg := startServing(t, man, 3)
	base, sv := sg.base, sg.sv
	if sv.spec.MaxTokens != 48 || sv.spec.MaxBatch != 4 || sv.spec.Codec != "fp32" {
		t.Fatalf("spec %+v", sv.spec)
	}
	texts := make([]string, 10)
	errs := make([]error, 10)
	var wg sync.WaitGroup
	for i := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			texts[i], errs[i] = streamCompletion(base, fmt.Sprintf("question %d:", i), 16)
		}()
	}
	wg.Wait()
	for i := range texts {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if want := localText(t, m.Stage, fmt.Sprintf("question %d:", i), 16); texts[i] != want {
			t.Fatalf("request %d: %q through the swarm, %q in one process", i, texts[i], want)
		}
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":25}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("max_tokens over the manifest's limit: %d", resp.StatusCode)
	}
	// Stopping reports each stage node's work to the coordinator, which
	// signs receipts from it.
	sg.stop()
	work := sg.swarm.Reported()
	for _, st := range sg.srv.Stats().Plan.Stages {
		w := work[st.Replicas[0]]
		if w.Tokens == 0 || w.ComputeS <= 0 {
			t.Fatalf("stage %d's node reported %+v; all: %v", st.Index, w, work)
		}
	}
}

// TestServeSwarmTrainedSubspace: a subspace checkpoint as `holopeer run`
// writes it (the model lives in pseudonym space; the dense head rows are
// put back in real order; the secret lies beside final/) is served with
// the subspace codec and pseudonymous ids, and generates what the model
// generates in pseudonym space.
func TestServeSwarmTrainedSubspace(t *testing.T) {
	out := t.TempDir()
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 3, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 64,
		Subspace: model.SubspaceConfig{Rank: 8, Seed: 5}}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	serveTestModel(t, m)
	secret := []byte("sixteen bytes and then some more")
	if err := os.WriteFile(filepath.Join(out, "pseudonyms.secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	perm, err := pipeline.NewPermutation(cfg.Vocab, secret)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int32, cfg.Vocab)
	for i := range ids {
		ids[i] = int32(i)
	}
	ps := perm.Apply(ids)
	snap, err := checkpoint.Capture([]*model.Stage{m.Stage}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, ts := range snap.Dense { // row t of the export = the model's row pseudonym(t)
		if ts.Name != model.NameHead && ts.Name != model.NameEmbed {
			continue
		}
		cols := ts.Shape[1]
		real := make([]float32, len(ts.Data))
		for r := range cfg.Vocab {
			copy(real[r*cols:(r+1)*cols], ts.Data[int(ps[r])*cols:(int(ps[r])+1)*cols])
		}
		snap.Dense[i].Data = real
	}
	if err := checkpoint.Save(filepath.Join(out, "final"), snap, checkpoint.WithTokenizer(tokenizer.Byte())); err != nil {
		t.Fatal(err)
	}
	man := writeManifest(t, out, `
name: tiny
tokenizer: byte
model: {checkpoint: final}
pipeline: {stages: 3, codec: subspace, rank: 8, subspace_seed: 5}
serve: {max_prompt_tokens: 24, max_output_tokens: 24}
`)
	sg := startServing(t, man, 3)
	base, sv, srv := sg.base, sg.sv, sg.srv
	if sv.perm == nil {
		t.Fatal("the run's secret was not found")
	}
	if _, err := streamCompletion(base, "hello", 20); err != nil {
		t.Fatal(err)
	}
	prompt := []int32{'h', 'e', 'l', 'l', 'o'}
	var got []int32
	err = srv.Generate(context.Background(), prompt, 20, serve.NewSampler(serve.Sampling{}).Pick, func(tok int32) bool {
		got = append(got, tok)
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	// The model in pseudonym space, by hand, fed the swarm's tokens: ids
	// go in as pseudonyms and real token t is scored by the logit of
	// pseudonym(t). The subspace codec rebuilds activations up to float
	// rounding, so every token must be the greedy choice within 1e-3; a
	// wrong mapping of the head's rows misses by whole units.
	c := m.NewCache()
	defer c.Free()
	o, err := m.Infer(c, model.Input{Batch: 1, Seq: len(prompt), Tokens: perm.Apply(prompt)})
	if err != nil {
		t.Fatal(err)
	}
	logits := o.Logits[(len(prompt)-1)*cfg.Vocab:]
	for i, tok := range got {
		best := 0
		for id := range cfg.Vocab {
			if logits[ps[id]] > logits[ps[best]] {
				best = id
			}
		}
		if gap := logits[ps[best]] - logits[ps[tok]]; gap > 1e-3 {
			t.Fatalf("token %d: the swarm chose %d, %g below the model's choice %d", i, tok, gap, best)
		}
		if o, err = m.Infer(c, model.Input{Batch: 1, Seq: 1, Tokens: []int32{ps[tok]}}); err != nil {
			t.Fatal(err)
		}
		logits = o.Logits
	}
}

// TestPrepareServeRefuses: manifests that cannot be served say why.
func TestPrepareServeRefuses(t *testing.T) {
	dir := t.TempDir()
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 3, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 64}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkpointtest.Save(t, filepath.Join(dir, "ckpt"), []*model.Stage{m.Stage})
	m.Close()
	for text, want := range map[string]string{
		"name: x\npipeline: {codec: int8}\n":                                                   "model.checkpoint",
		"name: x\nmodel: {checkpoint: nowhere}\npipeline: {codec: int8}\n":                     "model.checkpoint",
		"name: x\nmodel: {checkpoint: ckpt}\npipeline: {codec: subspace, rank: 8}\n":           "dense model",
		"name: x\ntokenizer: gpt2\nmodel: {checkpoint: ckpt}\npipeline: {codec: int8}\n":       "vocabulary",
		"name: x\nmodel: {checkpoint: ckpt}\npipeline: {codec: int8, stages: 4}\n":             "stages",
		"name: x\nmodel: {checkpoint: ckpt}\npipeline: {codec: bf16}\nserve: {max_batch: 1}\n": "",
	} {
		man := writeManifest(t, dir, text)
		sv, err := prepareServe(man)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", text, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: %v, want an error about %s", text, err, want)
		}
		if sv != nil {
			sv.ck.Close()
		}
	}
}
