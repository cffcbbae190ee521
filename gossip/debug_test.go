package gossip

import "fmt"

func (l *logCapture) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := ""
	for _, r := range *l.recs {
		if r.attrs["component"] == "pubsub" {
			continue
		}
		s += fmt.Sprintf("%v %s %v\n", r.level, r.msg, r.attrs)
	}
	return s
}
