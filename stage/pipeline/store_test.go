package pipeline

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holopeer/holopeer/stage/job"
)

func spoolFile(t *testing.T, dir, content string) string {
	t.Helper()
	os.MkdirAll(dir, 0o700)
	f, err := os.CreateTemp(dir, "blob-*")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(content)
	f.Close()
	return f.Name()
}

// A checkpoint that cannot be written whole (here a shard that vanished,
// as on a full disk) leaves the previous checkpoint intact and says so;
// a shard corrupted on disk is refused before it is sent anywhere.
func TestDiskStoreKeepsPreviousCheckpoint(t *testing.T) {
	s := &DiskStore{Dir: t.TempDir()}
	plan := &job.Plan{JobID: "j"}
	own := [2][]byte{[]byte("embed"), []byte("head")}
	if err := s.Save(2, plan, []string{spoolFile(t, s.Incoming(), "zero"), spoolFile(t, s.Incoming(), "one")}, own); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(s.Incoming(), "blob-gone")
	err := s.Save(4, plan, []string{spoolFile(t, s.Incoming(), "zero4"), gone}, own)
	if err == nil || !strings.Contains(err.Error(), "checkpoint 2 is intact") {
		t.Fatalf("err = %v, want it to say checkpoint 2 is intact", err)
	}
	if latest, _ := s.Latest(); latest != 2 {
		t.Fatalf("latest = %d after a failed save", latest)
	}
	c, err := s.Open(2)
	if err != nil {
		t.Fatal(err)
	}
	f, size, err := c.Shard(1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "one" || size != 3 || c.Stages() != 2 {
		t.Fatalf("shard 1 = %q (%d bytes), %d stages", b, size, c.Stages())
	}
	if got, err := c.Own(); err != nil || string(got[1]) != "head" {
		t.Fatalf("own = %q, %v", got, err)
	}
	if left, _ := os.ReadDir(s.Incoming()); len(left) != 0 {
		t.Fatalf("%d spooled files left behind", len(left))
	}
	os.WriteFile(filepath.Join(c.Dir, shardName(0)), []byte("zer0"), 0o600)
	if _, _, err := c.Shard(0); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("a corrupt shard: %v", err)
	}
}
