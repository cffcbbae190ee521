// Package netem builds an emulated home internet link between two network
// namespaces (default 80 Mbit/s each way and 20 ms each way, a 40 ms round
// trip) and measures how many tokens per second cross one pipeline
// boundary over it with each codec.
//
// It needs root. It creates two namespaces and the devices between them,
// named hpw<pid>n<seq>a and …b, touches nothing else, removes them on
// Close and on SIGINT/SIGTERM, and removes leftovers of its own earlier
// runs whose process is gone.
//
// The link is shaped by `tc qdisc … netem rate … delay …` on a veth pair.
// Where the kernel lacks sch_netem (some containers and minimal kernels),
// it falls back to a userspace emulator: a TUN device in each namespace
// and a forwarder that holds each packet for its serialisation time at the
// rate plus the delay, in order, with netem's default 1000-packet queue.
// Link.Mode says which one ran.
package netem

import (
	"errors"
	"time"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

// Config describes the emulated link. Both directions get the same shape.
type Config struct {
	RateMbit float64       // per direction; 0 means 80
	Delay    time.Duration // one way; 0 means 20 ms
	// ForceUserspace uses the TUN emulator even where tc netem works (for
	// testing the fallback).
	ForceUserspace bool
}

func (c Config) withDefaults() Config {
	if c.RateMbit == 0 {
		c.RateMbit = 80
	}
	if c.Delay == 0 {
		c.Delay = 20 * time.Millisecond
	}
	return c
}

// Modes of emulation.
const (
	ModeNetem     = "tc-netem"
	ModeUserspace = "userspace-tun"
)

// ErrUnavailable is wrapped by Setup's error when the machine cannot host
// the link (not root, no `ip`, no netem and no TUN); callers skip.
var ErrUnavailable = errors.New("netem: emulated link unavailable")

// EnvPeer carries a child's instructions (JSON) from Measure to PeerMain.
const EnvPeer = "HOLOPEER_NETEM_PEER"

// resultPrefix starts the one line of stdout a child reports on.
const resultPrefix = "HOLOPEER-NETEM-RESULT "

const port = 4601

// Run is one measurement: a stream of forward frames of Tokens tokens
// from side 0 to side 1 for Duration.
type Run struct {
	Codec    codec.ID
	Dim      int
	Rank     int // subspace codecs
	Vocab    int // subspace codecs: token ids are drawn below it
	Seed     uint64
	Tokens   int
	Duration time.Duration
}

// Result is what the receiving side counted, after the first frame (so
// connection set-up and the first round trip are not in the rate).
type Result struct {
	Tokens        int64   `json:"tokens"`
	Seconds       float64 `json:"seconds"`
	TokensPerSec  float64 `json:"tokens_per_s"`
	BytesPerToken float64 `json:"bytes_per_token"` // on the stream
	Path          string  `json:"path"`
}
