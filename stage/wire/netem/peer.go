//go:build linux

package netem

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	lpnoise "github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

type peerConfig struct {
	Role     string `json:"role"` // "send" or "recv"
	Key      string `json:"key"`  // base64 libp2p private key
	PeerKey  string `json:"peer_key"`
	Listen   string `json:"listen"`
	PeerAddr string `json:"peer_addr"`
	Run      Run    `json:"run"`
}

// Measure runs one measurement across the link. self is the command line
// that makes a child process call PeerMain (for the holopeer binary a
// hidden subcommand; for a test binary -test.run of a test that does).
func (l *Link) Measure(ctx context.Context, self []string, r Run) (Result, error) {
	if len(self) == 0 {
		return Result{}, errors.New("netem: no command to run the peers")
	}
	if r.Duration <= 0 {
		r.Duration = 5 * time.Second
	}
	ks, kr := newKey(), newKey()
	base := peerConfig{Run: r}
	send, recv := base, base
	send.Role, send.Key, send.PeerKey = "send", ks, kr
	send.PeerAddr = fmt.Sprintf("/ip4/%s/tcp/%d", l.Addr[1], port)
	recv.Role, recv.Key, recv.PeerKey = "recv", kr, ks
	recv.Listen = send.PeerAddr

	ctx, cancel := context.WithTimeout(ctx, r.Duration+60*time.Second)
	defer cancel()
	type outcome struct {
		res Result
		err error
	}
	start := func(side int, pc peerConfig) (chan outcome, error) {
		js, _ := json.Marshal(pc)
		cmd := l.Command(ctx, side, self[0], self[1:]...)
		cmd.Env = append(os.Environ(), EnvPeer+"="+string(js))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), resultPrefix); ok {
					o.err = json.Unmarshal([]byte(line), &o.res)
				}
			}
			if err := cmd.Wait(); err != nil && o.err == nil {
				o.err = fmt.Errorf("%s peer: %w: %s", pc.Role, err, tail(stderr.String()))
			}
			done <- o
		}()
		return done, nil
	}
	recvDone, err := start(1, recv)
	if err != nil {
		return Result{}, err
	}
	sendDone, err := start(0, send)
	if err != nil {
		cancel()
		<-recvDone
		return Result{}, err
	}
	so := <-sendDone
	ro := <-recvDone
	if so.err != nil {
		return Result{}, so.err
	}
	if ro.err != nil {
		return Result{}, ro.err
	}
	return ro.res, nil
}

func tail(s string) string {
	if len(s) > 800 {
		s = "…" + s[len(s)-800:]
	}
	return strings.TrimSpace(s)
}

func newKey() string {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		panic(err)
	}
	b, _ := crypto.MarshalPrivateKey(k)
	return base64.StdEncoding.EncodeToString(b)
}

func parseKey(s string) (crypto.PrivKey, peer.ID, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, "", err
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, "", err
	}
	id, err := peer.IDFromPrivateKey(k)
	return k, id, err
}

// PeerMain is a child's whole life: it reads its instructions from
// EnvPeer, sends or receives, and the receiver prints the Result line on
// stdout.
func PeerMain(ctx context.Context, stdout io.Writer) error {
	var pc peerConfig
	if err := json.Unmarshal([]byte(os.Getenv(EnvPeer)), &pc); err != nil {
		return fmt.Errorf("netem peer: %s: %w", EnvPeer, err)
	}
	key, _, err := parseKey(pc.Key)
	if err != nil {
		return err
	}
	_, remote, err := parseKey(pc.PeerKey)
	if err != nil {
		return err
	}
	r := pc.Run
	var basis *subspace.Basis
	if r.Codec.Subspace() {
		if basis, err = subspace.New(subspace.Config{Dim: r.Dim, Rank: r.Rank, Vocab: r.Vocab, Seed: r.Seed}); err != nil {
			return err
		}
	}
	c, err := codec.New(r.Codec, codec.Params{Dim: r.Dim, Basis: basis})
	if err != nil {
		return err
	}
	opts := []libp2p.Option{libp2p.Identity(key), libp2p.Transport(tcp.NewTCPTransport), libp2p.DisableMetrics(),
		libp2p.Security(lpnoise.ID, lpnoise.New), libp2p.Security(libp2ptls.ID, libp2ptls.New)}
	if pc.Listen != "" {
		opts = append(opts, libp2p.ListenAddrStrings(pc.Listen))
	} else {
		opts = append(opts, libp2p.NoListenAddrs)
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		return err
	}
	defer h.Close()
	job := wire.JobID{'n', 'e', 't', 'e', 'm'}
	spec := wire.LinkSpec{Codec: c, Tokens: r.Tokens}
	if pc.Role == "recv" {
		spec.Accept = wire.Kinds(wire.KindForward)
	}
	auth := wire.NewStaticAuthorizer()
	auth.Allow(job, remote, spec)
	svc, err := wire.NewService(h, auth, wire.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		return err
	}
	defer svc.Close()
	if pc.Role == "recv" {
		return receive(ctx, svc, r, stdout)
	}
	return send(ctx, h, svc, remote, pc.PeerAddr, job, c, basis, r)
}

func receive(ctx context.Context, svc *wire.Service, r Run, stdout io.Writer) error {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := svc.Accept(actx)
	if err != nil {
		return fmt.Errorf("netem receiver: accept: %w", err)
	}
	defer l.Close()
	var first, last time.Time
	var tokens, frames int64
	var bytesAtFirst int64
	for {
		f, err := l.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("netem receiver: %w", err)
		}
		now := time.Now()
		if frames == 0 {
			first = now
			bytesAtFirst = l.Stats().BytesRecv
		} else {
			tokens += int64(f.Tokens)
		}
		last = now
		frames++
	}
	if frames < 2 {
		return fmt.Errorf("netem receiver: only %d frames arrived", frames)
	}
	secs := last.Sub(first).Seconds()
	res := Result{Tokens: tokens, Seconds: secs, TokensPerSec: float64(tokens) / secs,
		BytesPerToken: float64(l.Stats().BytesRecv-bytesAtFirst) / float64(tokens), Path: l.Path()}
	js, _ := json.Marshal(res)
	_, err = fmt.Fprintf(stdout, "%s%s\n", resultPrefix, js)
	return err
}

func send(ctx context.Context, h host.Host, svc *wire.Service, remote peer.ID, addr string, job wire.JobID, c codec.Codec, basis *subspace.Basis, r Run) error {
	maddr, err := ma.NewMultiaddr(addr)
	if err != nil {
		return err
	}
	// The receiver may still be starting: retry the dial for a while.
	deadline := time.Now().Add(20 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = h.Connect(cctx, peer.AddrInfo{ID: remote, Addrs: []ma.Multiaddr{maddr}})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("netem sender: connect: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	l, err := svc.OpenLink(ctx, remote, job)
	if err != nil {
		return fmt.Errorf("netem sender: %w", err)
	}
	defer l.Close()
	n, d := r.Tokens, r.Dim
	rng := mrand.New(mrand.NewPCG(r.Seed, 1))
	data := make([]float32, n*d)
	var ids []int
	if basis != nil {
		// Activations of a constrained model: E_fix[id] + C·Uᵀ.
		ids = make([]int, n)
		for i := range ids {
			ids[i] = rng.IntN(r.Vocab)
		}
		coef := make([]float32, n*basis.Rank())
		for i := range coef {
			coef[i] = float32(rng.NormFloat64())
		}
		basis.Decode(coef, ids, data)
	} else {
		for i := range data {
			data[i] = float32(rng.NormFloat64())
		}
	}
	start := time.Now()
	for step := uint64(0); time.Since(start) < r.Duration; step++ {
		if err := l.Send(ctx, wire.Frame{Kind: wire.KindForward, Step: step, Data: data, IDs: ids}); err != nil {
			return fmt.Errorf("netem sender: %w", err)
		}
	}
	if err := l.CloseSend(); err != nil {
		return err
	}
	// Wait for the receiver to finish reading before tearing down.
	if _, err := l.Recv(ctx); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, wire.ErrClosed) {
		var we *wire.Error
		if !errors.As(err, &we) {
			return nil // the receiver closed its end: done either way
		}
	}
	return nil
}
