package peer

import (
	"os"
	"path/filepath"
	"testing"
)

// A crash while writing a key leaves at most a temporary file beside it:
// the key on disk stays whole and the same, and a data dir with only a
// torn temporary file gets a fresh, whole key.
func TestIdentityWriteSurvivesCrash(t *testing.T) {
	dir := t.TempDir()
	k1, err := CreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, IdentityFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	whole, _ := os.ReadFile(path)
	// A second writer died half way through its temporary file.
	torn := filepath.Join(dir, "."+IdentityFile+".tmp-42")
	if err := os.WriteFile(torn, whole[:len(whole)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateIdentity(dir)
	if err != nil || !k2.Equals(k1) {
		t.Fatalf("after a crashed write: %v (same key %v)", err, err == nil && k2.Equals(k1))
	}
	if _, err := CreateIdentity(dir); err == nil {
		t.Fatal("overwrote the key")
	}
	if b, _ := os.ReadFile(path); string(b) != string(whole) {
		t.Fatal("the key on disk changed")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("CreateIdentity left files behind: %v", entries)
	}

	// Only a torn temporary file: the node gets a new whole key.
	fresh := t.TempDir()
	if err := os.WriteFile(filepath.Join(fresh, "."+IdentityFile+".tmp-7"), whole[:10], 0o600); err != nil {
		t.Fatal(err)
	}
	k3, err := LoadOrCreateIdentity(fresh)
	if err != nil || k3.Equals(k1) {
		t.Fatalf("fresh dir: %v", err)
	}
	if k4, err := LoadIdentity(fresh); err != nil || !k4.Equals(k3) {
		t.Fatalf("reload: %v", err)
	}
}
