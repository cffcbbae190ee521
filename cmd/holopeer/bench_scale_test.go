package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchScaleQuick runs `holopeer bench --only scale --quick` as the
// README shows it: a small bf16 checkpoint served through four `holopeer
// up` processes must give exactly the tokens `holopeer generate` gives; a
// small model trains across four more with one killed after the first
// checkpoint and recovers; every figure is one JSON object per line with
// the memory of each process measured.
func TestBenchScaleQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes")
	}
	cmd := exec.Command(binPath, "bench", "--only", "scale", "--quick")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errb.String())
	}
	rows := map[string]benchRow{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r benchRow
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q is not a bench row: %v", sc.Text(), err)
		}
		rows[r.Name] = r
	}
	if r := rows["scale.serve_quick.token_identical"]; r.Value != 1 {
		t.Fatalf("swarm and single process differ: %s", r.Note)
	}
	nodes := 0
	for name, r := range rows {
		if strings.HasSuffix(name, "peak_rss_bytes") {
			if r.Value <= 0 {
				t.Fatalf("%s not measured", name)
			}
			if strings.Contains(name, ".node") {
				nodes++
			}
		}
	}
	if nodes != scaleNodes+scaleTrainNodes || rows["scale.serve_quick.tokens_per_s"].Value <= 0 {
		t.Fatalf("rows: %v", rows)
	}
	if r := rows["scale.train_quick.recoveries"]; r.Value != 1 || rows["scale.train_quick.tokens_per_s"].Value <= 0 {
		t.Fatalf("training across the swarm with a kill after the first checkpoint: %+v", rows)
	}
}
