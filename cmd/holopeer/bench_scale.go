package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/job"
)

func init() {
	registerBench(benchGroup{Name: "scale", Run: benchScale, Explicit: true})
}

// scaleNodes is how many `holopeer up` processes hold the served model.
const scaleNodes = 4

// benchScale serves (and then trains, benchScaleTrain) a TinyLlama-1.1B-shaped bf16 checkpoint (with --quick,
// a small model of the same build) through scaleNodes `holopeer up`
// processes on loopback, each lending less than 40% of the model's bytes,
// and compares it with `holopeer generate` in one process on the same
// checkpoint: the tokens must be identical. Every figure comes from real
// child processes of this binary; memory is each one's peak RSS.
func benchScale(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "holopeer-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ck := filepath.Join(dir, "ckpt")
	name, shape := "1.1b", []string{"--shape", "tinyllama-1.1b"}
	newTokens := 32
	if o.Quick {
		name, shape = "quick", []string{"--dim", "128", "--layers", "8", "--heads", "4", "--kv-heads", "2", "--ffn", "352", "--vocab", "2048", "--max-seq", "256"}
		newTokens = 12
	}
	pre := "scale.serve_" + name + "."
	progress("scale: writing a random %s bf16 checkpoint", name)
	wrote, err := runChild(ctx, exe, append(append([]string{"checkpoint", "init"}, shape...), "--dtype", "bf16", ck)...)
	if err != nil {
		return err
	}
	emit(row(pre+"checkpoint_init_s", wrote.wall.Seconds(), "s", 0))
	c, err := checkpoint.Open(ck)
	if err != nil {
		return err
	}
	cfg := c.Config()
	c.Close()
	modelBytes, err := dirBytes(ck, ".safetensors")
	if err != nil {
		return err
	}
	emit(row(pre+"model_bytes", float64(modelBytes), "bytes", 0))

	prompt := make([]string, 16)
	for i := range prompt {
		prompt[i] = strconv.Itoa((i*7919 + 13) % 256)
	}
	progress("scale: generating %d tokens in one process", newTokens)
	gen, err := runChild(ctx, exe, "generate", "--checkpoint", ck, "--tokens", strings.Join(prompt, ","), "--max-tokens", strconv.Itoa(newTokens), "--json")
	if err != nil {
		return err
	}
	var want struct {
		Tokens      []int   `json:"tokens"`
		LoadS       float64 `json:"load_s"`
		FirstTokenS float64 `json:"first_token_s"`
		TokensPerS  float64 `json:"tokens_per_s"`
	}
	if err := json.Unmarshal(gen.stdout, &want); err != nil {
		return fmt.Errorf("generate --json: %w: %s", err, gen.stdout)
	}
	emit(row(pre+"generate.peak_rss_bytes", float64(gen.rss), "bytes", float64(modelBytes)))
	emit(row(pre+"generate.load_s", want.LoadS, "s", 0))

	lend := modelBytes * 39 / 100
	if o.Quick {
		lend += 192 << 20 // a stage's fixed needs dwarf a small model: a smoke run only
	}
	sw, err := startScaleSwarm(ctx, exe, dir, lend, scaleNodes)
	if err != nil {
		return err
	}
	defer sw.stop()
	res, err := sw.serve(ctx, ck, prompt, newTokens)
	if err != nil {
		return err
	}
	sw.stop()

	same := 0.0
	if slices.Equal(res.tokens, want.Tokens) {
		same = 1
	}
	identical := row(pre+"token_identical", same, "bool", 1)
	identical.Note = fmt.Sprintf("swarm %v, one process %v", res.tokens, want.Tokens)
	emit(identical)
	emit(row(pre+"ready_s", res.ready.Seconds(), "s", want.LoadS))
	emit(row(pre+"serve_to_first_token_s", res.serveToFirst.Seconds(), "s", want.LoadS+want.FirstTokenS))
	emit(row(pre+"first_token_s", res.firstToken.Seconds(), "s", want.FirstTokenS))
	emit(row(pre+"tokens_per_s", res.tokensPerS, "tokens/s", want.TokensPerS))

	spec := job.Spec{Kind: job.KindServe, Model: cfg, MaxBatch: 1, MaxTokens: scaleMaxTokens(cfg.MaxSeq), WeightDType: job.WeightBF16}
	perBlock := spec.LayerBytes(scaleNodes)
	for i, n := range sw.nodes {
		r := row(fmt.Sprintf("%snode%d.peak_rss_bytes", pre, i), float64(n.proc.rss), "bytes", float64(uint64(n.blocks)*perBlock))
		r.Note = fmt.Sprintf("%d blocks (baseline: their bf16 weights and KV cache), lends %d bytes", n.blocks, sw.lend)
		emit(r)
	}
	own := 2 * 2 * cfg.Vocab * cfg.Dim // embedding and head, bf16
	r := row(pre+"researcher.peak_rss_bytes", float64(res.researcher.rss), "bytes", float64(own+512<<20))
	r.Note = "baseline: its embedding and head in bf16 plus 512 MiB"
	emit(r)
	if same != 1 {
		return fmt.Errorf("the swarm generated %v, one process %v", res.tokens, want.Tokens)
	}
	os.RemoveAll(dir) // the 2.2 GB checkpoint, before training writes its shards
	return benchScaleTrain(ctx, o, emit)
}

// scaleMaxTokens is the serve manifest's context: 64 prompt + 64 output.
func scaleMaxTokens(maxSeq int) int { return min(maxSeq, 128) }

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// childRun is a finished child process.
type childRun struct {
	stdout []byte
	wall   time.Duration
	rss    int64 // peak resident set, bytes
}

// runChild runs this binary with args to completion.
func runChild(ctx context.Context, exe string, args ...string) (childRun, error) {
	cmd := exec.CommandContext(ctx, exe, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := childRun{stdout: out.Bytes(), wall: time.Since(start)}
	if cmd.ProcessState != nil {
		r.rss = peakRSS(cmd.ProcessState)
	}
	if err != nil {
		return r, fmt.Errorf("holopeer %s: %w\n%s", strings.Join(args, " "), err, errb.Bytes())
	}
	return r, nil
}

// child is a running child process whose output is kept.
type child struct {
	args []string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	rss  int64
}

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func startChild(exe string, args ...string) (*child, error) {
	c := &child{args: args, cmd: exec.Command(exe, args...), done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = c, c
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		c.cmd.Wait()
		c.rss = peakRSS(c.cmd.ProcessState)
		close(c.done)
	}()
	return c, nil
}

// stop asks the child to exit and waits; it kills it after 30 s.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// waitFor polls the child's output for re until the child exits or ctx ends.
func (c *child) waitFor(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	for {
		if m := re.FindStringSubmatch(c.output()); m != nil {
			return m, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("holopeer %s exited: %s", c.args[0], lastLines(c.output(), 20))
		case <-ctx.Done():
			return nil, fmt.Errorf("holopeer %s: %w waiting for %q: %s", c.args[0], ctx.Err(), re, lastLines(c.output(), 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

type scaleNode struct {
	proc   *child
	id     string
	blocks int
}

type scaleSwarm struct {
	exe, dir string
	boot     string
	lend     int64
	nodes    []*scaleNode
	others   []*child
}

var nodeAddrRE = regexp.MustCompile(`address\s+(/ip4/127\.0\.0\.1/tcp/\S+/p2p/(\S+))`)

// startScaleSwarm starts the lending nodes: the first attests with sim
// (INSECURE, loopback only) so that a coordinator exists; each lends lend
// bytes.
func startScaleSwarm(ctx context.Context, exe, dir string, lend int64, nodes int) (*scaleSwarm, error) {
	sw := &scaleSwarm{exe: exe, dir: dir, lend: lend}
	for i := range nodes {
		args := []string{"up", "--data-dir", filepath.Join(dir, fmt.Sprintf("node%d", i)), "--swarm", "scale-bench",
			"--listen", "/ip4/127.0.0.1/tcp/0", "--api", "off", "--memory", strconv.FormatInt(sw.lend, 10),
			"--allow-sim", "--port-mapping=false", "--relay=false", "--log-level", "warn"}
		if i == 0 {
			args = append(args, "--tee", "sim")
		} else {
			args = append(args, "--bootstrap", sw.boot)
		}
		c, err := startChild(exe, args...)
		if err != nil {
			sw.stop()
			return nil, err
		}
		n := &scaleNode{proc: c}
		sw.nodes = append(sw.nodes, n)
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		m, err := c.waitFor(wctx, nodeAddrRE)
		cancel()
		if err != nil {
			sw.stop()
			return nil, err
		}
		n.id = m[2]
		c.args = append(c.args[:1:1], fmt.Sprintf("node %d", i))
		if i == 0 {
			sw.boot = m[1]
		}
	}
	return sw, nil
}

func (sw *scaleSwarm) stop() {
	for _, c := range sw.others {
		c.stop()
	}
	for _, n := range sw.nodes {
		n.proc.stop()
	}
}

type scaleServe struct {
	tokens       []int
	ready        time.Duration // serve started → API answers
	serveToFirst time.Duration // serve started → first token streamed
	firstToken   time.Duration // request sent → first token
	tokensPerS   float64       // after the first token
	researcher   *child
}

var (
	stageRE   = regexp.MustCompile(`(?m)^stage \d+: blocks (\d+)-(\d+) on (\S+)`)
	apiRE     = regexp.MustCompile(`OpenAI-compatible API on (http://\S+)/v1`)
	tokenIDRE = regexp.MustCompile(`^token_id:(\d+)$`)
)

// serve runs `holopeer serve` on ck, then one greedy streaming completion.
func (sw *scaleSwarm) serve(ctx context.Context, ck string, prompt []string, n int) (*scaleServe, error) {
	man := filepath.Join(sw.dir, "serve.yaml")
	yaml := fmt.Sprintf(`name: scale
tokenizer: byte
model:
  checkpoint: %s
pipeline:
  stages: %d
  replicas_per_stage: 1
  codec: fp32
serve:
  max_prompt_tokens: 64
  max_output_tokens: 64
  max_batch: 1
  max_queue: 4
`, ck, scaleNodes)
	if err := os.WriteFile(man, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	httpAddr, err := freeLoopback()
	if err != nil {
		return nil, err
	}
	progress("scale: serving through %d nodes lending %d MiB each", scaleNodes, sw.lend>>20)
	start := time.Now()
	c, err := startChild(sw.exe, "serve", man, "--data-dir", filepath.Join(sw.dir, "researcher"), "--swarm", "scale-bench",
		"--bootstrap", sw.boot, "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "off", "--http", httpAddr, "--allow-sim",
		"--port-mapping=false", "--relay=false", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	sw.others = append(sw.others, c)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	m, err := c.waitFor(wctx, apiRE)
	if err != nil {
		return nil, err
	}
	res := &scaleServe{ready: time.Since(start), researcher: c}
	base := m[1]
	for _, s := range stageRE.FindAllStringSubmatch(c.output(), -1) {
		first, _ := strconv.Atoi(s[1])
		last, _ := strconv.Atoi(s[2])
		for _, node := range sw.nodes {
			if strings.Contains(s[3], node.id) {
				node.blocks += last - first + 1
			}
		}
	}
	ids := "[" + strings.Join(prompt, ",") + "]"
	body := fmt.Sprintf(`{"model":"scale","prompt":%s,"max_tokens":%d,"temperature":0,"stream":true,"logprobs":0,"return_tokens_as_token_ids":true}`, ids, n)
	req, err := http.NewRequestWithContext(wctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("completion: %d %s", resp.StatusCode, b)
	}
	var firstAt, lastAt time.Time
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Logprobs *struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return nil, fmt.Errorf("completion event %s: %w", data, err)
		}
		for _, ch := range ev.Choices {
			if ch.Logprobs == nil {
				continue
			}
			for _, tok := range ch.Logprobs.Tokens {
				m := tokenIDRE.FindStringSubmatch(tok)
				if m == nil {
					return nil, fmt.Errorf("completion token %q is not token_id:N", tok)
				}
				id, _ := strconv.Atoi(m[1])
				res.tokens = append(res.tokens, id)
				lastAt = time.Now()
				if firstAt.IsZero() {
					firstAt = lastAt
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(res.tokens) == 0 {
		return nil, errors.New("the completion streamed no tokens")
	}
	res.serveToFirst = firstAt.Sub(start)
	res.firstToken = firstAt.Sub(sent)
	if len(res.tokens) > 1 {
		res.tokensPerS = float64(len(res.tokens)-1) / lastAt.Sub(firstAt).Seconds()
	}
	return res, nil
}

// freeLoopback is a 127.0.0.1 TCP address that was free a moment ago.
func freeLoopback() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// dirBytes sums the sizes of dir's files ending in suffix.
func dirBytes(dir, suffix string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), suffix) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return 0, err
		}
		n += info.Size()
	}
	return n, nil
}
