//go:build linux

package netem

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// queueLimit is netem's default limit: packets waiting on the link.
const queueLimit = 1000

// openTUN creates a layer-3 TUN device (no packet information header).
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netem: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netem: TUNSETIFF %s: %w", name, err)
	}
	// Non-blocking, so the runtime poller serves reads and Close wakes them.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "tun:"+name), nil
}

// emulator forwards packets between two TUN devices as a link of the
// configured rate and one-way delay would: each packet leaves when the
// link has finished sending the ones before it (its size at the rate) and
// arrives Delay later. A full queue drops, like netem's limit.
type emulator struct {
	devs  [2]*os.File
	pipes [2]*pipe // pipes[i] carries devs[i] → devs[1-i]
	wg    sync.WaitGroup
}

type packet struct {
	data []byte
	at   time.Time
}

type pipe struct {
	in, out     *os.File
	bytesPerSec float64
	delay       time.Duration

	mu        sync.Mutex
	cond      *sync.Cond
	queue     []packet
	busyUntil time.Time
	closed    bool
	drops     int
}

func newEmulator(devs [2]*os.File, cfg Config) *emulator {
	e := &emulator{devs: devs}
	for i := range e.pipes {
		p := &pipe{in: devs[i], out: devs[1-i], bytesPerSec: cfg.RateMbit * 1e6 / 8, delay: cfg.Delay}
		p.cond = sync.NewCond(&p.mu)
		e.pipes[i] = p
	}
	return e
}

func (e *emulator) start() {
	for _, p := range e.pipes {
		e.wg.Add(2)
		go func() { defer e.wg.Done(); p.receive() }()
		go func() { defer e.wg.Done(); p.deliver() }()
	}
}

func (e *emulator) stop() {
	for _, p := range e.pipes {
		p.mu.Lock()
		p.closed = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}
	for _, d := range e.devs {
		_ = d.Close()
	}
	e.wg.Wait()
}

// receive takes packets off the sending side and schedules them.
func (p *pipe) receive() {
	buf := make([]byte, 65536)
	for {
		n, err := p.in.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue // a transient error on one packet
		}
		now := time.Now()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		if len(p.queue) >= queueLimit {
			p.drops++
			p.mu.Unlock()
			continue
		}
		start := p.busyUntil
		if start.Before(now) {
			start = now
		}
		p.busyUntil = start.Add(time.Duration(float64(n) / p.bytesPerSec * float64(time.Second)))
		p.queue = append(p.queue, packet{data: append([]byte(nil), buf[:n]...), at: p.busyUntil.Add(p.delay)})
		p.cond.Signal()
		p.mu.Unlock()
	}
}

// deliver writes each packet to the receiving side at its arrival time.
// Arrival times never decrease, so the queue stays in order.
func (p *pipe) deliver() {
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && !p.closed {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return
		}
		pk := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		if d := time.Until(pk.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := p.out.Write(pk.data); errors.Is(err, os.ErrClosed) {
			return
		}
	}
}
