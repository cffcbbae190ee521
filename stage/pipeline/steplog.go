package pipeline

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// StepEvent is one line of a step log. Every node of a job appends one
// per optimizer step it applies and one per rollback, so the history of
// the job's weights can be replayed afterwards.
type StepEvent struct {
	Time  time.Time `json:"time"`
	Epoch uint64    `json:"epoch"`
	Event string    `json:"event"` // apply | rollback
	Step  uint64    `json:"step"`  // the step applied, or the step rolled back to
	Loss  float64   `json:"loss,omitempty"`
}

type stepLog struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

func openStepLog(path string) (*stepLog, error) {
	if path == "" {
		return &stepLog{}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pipeline: step log: %w", err)
	}
	return &stepLog{f: f, w: bufio.NewWriter(f)}, nil
}

func (l *stepLog) write(e StepEvent) {
	if l == nil || l.f == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Time = time.Now().UTC()
	b, _ := json.Marshal(e)
	l.w.Write(append(b, '\n'))
	l.w.Flush()
}

func (l *stepLog) Apply(epoch, step uint64) {
	l.write(StepEvent{Epoch: epoch, Event: "apply", Step: step})
}
func (l *stepLog) Rollback(epoch, step uint64) {
	l.write(StepEvent{Epoch: epoch, Event: "rollback", Step: step})
}
func (l *stepLog) ApplyLoss(epoch, step uint64, loss float64) {
	l.write(StepEvent{Epoch: epoch, Event: "apply", Step: step, Loss: loss})
}

func (l *stepLog) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Flush()
	return l.f.Close()
}

// ReadStepLog parses a step log, refusing lines over 4 KiB.
func ReadStepLog(r io.Reader) ([]StepEvent, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 4096)
	var out []StepEvent
	for n := 1; sc.Scan(); n++ {
		var e StepEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("step log line %d: %w", n, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// CheckExactlyOnce replays a step log and returns the committed steps in
// order. It fails if a step is applied out of order (a gap or a repeat not
// preceded by a rollback past it) or if the committed history is not
// 1, 2, …, last. A rollback to c undoes every application after c.
func CheckExactlyOnce(events []StepEvent) (committed []uint64, err error) {
	var cur uint64
	for i, e := range events {
		switch e.Event {
		case "apply":
			if e.Step != cur+1 {
				return nil, fmt.Errorf("event %d: step %d applied after step %d", i, e.Step, cur)
			}
			cur = e.Step
			committed = append(committed, e.Step)
		case "rollback":
			if e.Step > cur && len(committed) == 0 {
				// A node that joins mid-run starts from a restored
				// checkpoint: the steps before it were committed elsewhere.
				for s := uint64(1); s <= e.Step; s++ {
					committed = append(committed, s)
				}
				cur = e.Step
				continue
			}
			if e.Step > cur {
				return nil, fmt.Errorf("event %d: rollback to step %d, ahead of step %d", i, e.Step, cur)
			}
			cur = e.Step
			committed = committed[:e.Step]
		default:
			return nil, fmt.Errorf("event %d: unknown event %q", i, e.Event)
		}
	}
	for i, s := range committed {
		if s != uint64(i+1) {
			return nil, fmt.Errorf("committed history has step %d at position %d", s, i+1)
		}
	}
	return committed, nil
}
