package election

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Scripted scenarios, after etcd raft's interaction_test.go: each file in
// testdata is a list of commands, each followed by "----" and the output it
// must produce. go test -run TestInteraction -rewrite rewrites the
// expected output from the current behaviour (review the diff!).

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt expected output")

func TestInteraction(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptCmd struct {
	line    int
	comment string // the comment lines before it, kept by -rewrite
	text    string
	expect  string
}

func parseScript(t *testing.T, path string) []scriptCmd {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var cmds []scriptCmd
	var comment strings.Builder
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "#") {
			comment.WriteString(l + "\n")
			continue
		}
		c := scriptCmd{line: i + 1, comment: comment.String(), text: l}
		comment.Reset()
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "----" {
			t.Fatalf("%s:%d: command without ---- line", path, i+1)
		}
		i += 2
		var out []string
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			out = append(out, lines[i])
		}
		if len(out) > 0 {
			c.expect = strings.Join(out, "\n") + "\n"
		}
		cmds = append(cmds, c)
	}
	return cmds
}

func runScript(t *testing.T, path string) {
	cmds := parseScript(t, path)
	var nw *network
	var b strings.Builder
	failed := false
	for i := range cmds {
		c := &cmds[i]
		got := execCmd(t, &nw, c.text)
		if got != c.expect {
			if *rewrite {
				c.expect = got
			} else {
				t.Errorf("%s:%d: %s\n got:\n%s want:\n%s", path, c.line, c.text, got, c.expect)
				failed = true
			}
		}
	}
	if *rewrite {
		for _, c := range cmds {
			fmt.Fprintf(&b, "%s%s\n----\n%s\n", c.comment, c.text, c.expect)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if failed && nw != nil {
		t.Logf("final state:\n%s", nw.describe())
	}
}

func execCmd(t *testing.T, nwp **network, text string) string {
	f := strings.Fields(text)
	args := map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	num := func(k string, def int) int {
		if v, ok := args[k]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: %s=%q: %v", text, k, v, err)
			}
			return n
		}
		return def
	}
	nw := *nwp
	arg := func(i int) string {
		if i >= len(pos) {
			t.Fatalf("%s: missing argument %d", text, i+1)
		}
		if pos[i] == "coord" { // the coordinator all live peers agree on
			c := nw.coordinator()
			if c == "" {
				t.Fatalf("%s: no agreed coordinator", text)
			}
			return c
		}
		return pos[i]
	}
	if f[0] != "peers" && nw == nil {
		t.Fatalf("%s: no peers yet", text)
	}
	switch f[0] {
	case "peers":
		nw = newNetwork(t, uint64(num("seed", 1)), netOpts{
			hb: num("hb", 2), lease: num("lease", 0), backoff: num("backoff", 0), maxBackoff: num("maxbackoff", 0),
			maxJump: uint64(num("maxjump", 0)),
		})
		*nwp = nw
		for _, id := range splitList(args["stand"]) {
			nw.add(id, true)
		}
		for _, id := range splitList(args["vote"]) {
			nw.add(id, false)
		}
		nw.presence()
		return ""
	case "join":
		// join <peer> [stand=true]: a peer starts in a running swarm.
		nw.add(arg(0), args["stand"] == "true")
		nw.presence()
		return ""
	case "tick":
		for range num("n", atoi(t, arg(0))) {
			nw.tick()
		}
		return ""
	case "stabilize":
		max := atoi(t, arg(0))
		c, term, ticks := nw.stabilize(max)
		if ticks < 0 {
			return fmt.Sprintf("no agreement after %d ticks\n%s", max, nw.describe())
		}
		return fmt.Sprintf("agreed: %s term %d after %d ticks\n", c, term, ticks)
	case "status":
		return nw.describe()
	case "presence":
		nw.presence()
		return ""
	case "kill":
		nw.kill(arg(0))
		return ""
	case "restart":
		nw.restart(arg(0))
		return ""
	case "pause":
		nw.pause(arg(0), atoi(t, arg(1)))
		return ""
	case "isolate":
		nw.isolate(arg(0))
		return ""
	case "cut":
		// cut <from> <to>: messages from one peer no longer reach the other
		// (one way; cut both ways for a broken link).
		nw.cut[[2]string{arg(0), arg(1)}] = true
		return ""
	case "heal":
		nw.heal()
		return ""
	case "partition":
		var groups [][]string
		for _, g := range strings.Split(strings.TrimPrefix(text, "partition"), "|") {
			groups = append(groups, splitList(strings.TrimSpace(g)))
		}
		nw.partition(groups...)
		return ""
	case "delay":
		nw.delay = atoi(t, arg(0))
		return ""
	case "drop":
		p, err := strconv.ParseFloat(arg(0), 64)
		if err != nil {
			t.Fatal(err)
		}
		nw.drop = p
		return ""
	case "forge":
		return forge(t, nw, args["kind"], args["from"], uint64(num("n", 1)))
	case "ghostvote":
		return ghostVote(t, nw, args["from"], args["proof"], num("leases", 10))
	case "fence":
		// fence <peer> <term>: would the peer accept a command of that term?
		err := nw.nodes[arg(0)].n.AcceptTerm(uint64(atoi(t, arg(1))))
		if err != nil {
			return fmt.Sprintf("refused: %v\n", err)
		}
		return "accepted\n"
	}
	t.Fatalf("unknown command %q", text)
	return ""
}

// forge builds a hostile claim and steps it into every live peer, printing
// each peer's verdict. The peers' views must not change (the safety
// checker runs after each step).
func forge(t *testing.T, nw *network, kind, from string, jump uint64) string {
	// The current coordinator and its newest claim, as seen by the network.
	c := nw.coordinator()
	if c == "" {
		t.Fatalf("forge: no agreed coordinator")
	}
	cst := nw.nodes[c].n
	term := cst.Status().Term
	last := cst.own
	lastSeq := cst.seq
	var m Message
	claim := func(author string, t uint64, p Parent) Message {
		var salt [SaltSize]byte
		salt[0] = 7
		return Message{Type: MsgCandidacy, From: author, Coordinator: author, Term: t, Parent: p, Salt: salt, LeaseTicks: 10}
	}
	genuineParent := Parent{Term: term, Coordinator: c, Seq: lastSeq, Beacon: beacon(cst.secret, term, lastSeq)}
	switch kind {
	case "otherkey":
		// A peer that cannot attest presents evidence made for the coordinator's key.
		m = claim(from, term+1, genuineParent)
		nonce := Nonce(testSwarm, m.Term, m.Parent, m.Salt)
		m.Evidence = testEvidence(c, m.Term, nonce[:])
	case "replay":
		// The coordinator's own evidence for its current term, offered for the next.
		m = claim(c, term+1, last.parent)
		m.Salt = last.salt
		m.Evidence = last.evidence
	case "garbage":
		m = claim(from, term+1, genuineParent)
		m.Evidence = []byte("not evidence")
	case "parent":
		// A standing peer with valid evidence whose nonce descends from a
		// beacon the coordinator never sent.
		p := genuineParent
		p.Beacon[0] ^= 0xff
		m = claim(from, term+1, p)
		nonce := Nonce(testSwarm, m.Term, m.Parent, m.Salt)
		m.Evidence = testEvidence(from, m.Term, nonce[:])
	case "maxterm":
		// A peer that can attest (in a sim swarm: anyone) claims the last
		// term there is, with valid evidence and a genuine parent. Without
		// a bound, candidates then compute term 0 and the floor is bricked.
		m = claim(from, math.MaxUint64, genuineParent)
		nonce := Nonce(testSwarm, m.Term, m.Parent, m.Salt)
		m.Evidence = testEvidence(from, m.Term, nonce[:])
	case "jump":
		// A valid claim n terms above the coordinator's (n=… in the script).
		m = claim(from, term+jump, genuineParent)
		nonce := Nonce(testSwarm, m.Term, m.Parent, m.Salt)
		m.Evidence = testEvidence(from, m.Term, nonce[:])
	case "stale":
		m = claim(from, term, genuineParent)
		m.Parent = Parent{}
		if term < 2 {
			t.Fatalf("forge stale needs term ≥ 2")
		}
		m.Term = term - 1
		nonce := Nonce(testSwarm, m.Term, m.Parent, m.Salt)
		m.Evidence = testEvidence(from, m.Term, nonce[:])
	default:
		t.Fatalf("forge: unknown kind %q", kind)
	}
	var b strings.Builder
	for _, id := range nw.ids {
		tn := nw.nodes[id]
		if tn.dead || id == m.From {
			continue
		}
		err := tn.n.Step(m)
		nw.after(id)
		fmt.Fprintf(&b, "%s: %s\n", id, verdict(err))
	}
	return b.String()
}

// ghostVote is a peer without a TEE that, once a lease for the given
// number of leases, votes for a coordinator that never claimed: for the
// coordinator's term and for the term above it, with no proof
// (proof=none), garbage (proof=garbage), or evidence made for the
// coordinator's key rather than the ghost's (proof=otherkey). A
// coordinator that opens a new term for such a vote lets any peer churn
// the swarm's terms; the script prints the term at the end.
func ghostVote(t *testing.T, nw *network, from, proof string, leases int) string {
	c := nw.coordinator()
	if c == "" {
		t.Fatalf("ghostvote: no agreed coordinator")
	}
	start := nw.nodes[c].n.Status().Term
	for range leases {
		cur := nw.nodes[c].n
		term := cur.Status().Term
		for _, vt := range []uint64{term, term + 1} {
			m := Message{Type: MsgVote, From: from, Term: vt, Coordinator: "ghost"}
			m.Salt[0] = 9
			switch proof {
			case "none", "":
			case "garbage":
				m.Evidence = []byte("not evidence")
			case "otherkey":
				nonce := Nonce(testSwarm, vt, m.Parent, m.Salt)
				m.Evidence = testEvidence(c, vt, nonce[:])
			default:
				t.Fatalf("ghostvote: unknown proof %q", proof)
			}
			nw.inject(from, m)
		}
		for range nw.opts.lease {
			nw.tick()
		}
	}
	coord, term, ok := nw.agreement(nw.live())
	if !ok {
		return fmt.Sprintf("no agreement after %d leases\n%s", leases, nw.describe())
	}
	return fmt.Sprintf("after %d leases: %s term %d (was %s term %d)\n", leases, coord, term, c, start)
}

func verdict(err error) string {
	if err == nil {
		return "accepted"
	}
	for _, s := range []error{ErrMalformed, ErrStaleTerm, ErrConflict, ErrEvidence, ErrForgedParent, ErrUncheckedParent, ErrTermJump} {
		if errors.Is(err, s) {
			return "rejected: " + strings.TrimPrefix(s.Error(), "election: ")
		}
	}
	return "error: " + err.Error()
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}
