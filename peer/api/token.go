package api

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// TokenFile is the control API's token inside a node's data dir. Whoever
// can read it may change what the node does (start probes); the node
// writes it 0600, so that is the node's own user.
const TokenFile = "api.token"

// tokenBytes of randomness in a token (hex-encoded in the file).
const tokenBytes = 32

// Errors the token functions return. Check them with errors.Is.
var (
	ErrNoToken       = errors.New("no control API token")
	ErrInsecureToken = errors.New("control API token is readable by other users")
	ErrBadToken      = errors.New("control API token file is malformed")
)

// ReadToken reads the token in a node's data dir, as the CLI does. It
// refuses a file that group or others may read.
func ReadToken(dataDir string) (string, error) {
	path := filepath.Join(dataDir, TokenFile)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: %s does not exist (is the node running with --data-dir %s?)", ErrNoToken, path, dataDir)
	}
	if err != nil {
		return "", fmt.Errorf("control API token: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("%w: %s has mode %04o; run `chmod 600 %s`", ErrInsecureToken, path, perm, path)
	}
	if fi.Size() > 256 {
		return "", fmt.Errorf("%w: %s is %d bytes", ErrBadToken, path, fi.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("control API token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if raw, err := hex.DecodeString(tok); err != nil || len(raw) != tokenBytes {
		return "", fmt.Errorf("%w: %s (delete it and restart the node for a new one)", ErrBadToken, path)
	}
	return tok, nil
}

// LoadOrCreateToken reads the token in dataDir, creating a random one on
// first start. It is written to a temporary file, synced and renamed into
// place, so a crash never leaves a torn token.
func LoadOrCreateToken(dataDir string) (string, error) {
	tok, err := ReadToken(dataDir)
	if !errors.Is(err, ErrNoToken) {
		return tok, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("control API token: %w", err)
	}
	raw := make([]byte, tokenBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("control API token: %w", err)
	}
	tok = hex.EncodeToString(raw)
	if err := writeFileAtomic(filepath.Join(dataDir, TokenFile), []byte(tok+"\n")); err != nil {
		return "", fmt.Errorf("control API token: %w", err)
	}
	return tok, nil
}

// writeFileAtomic writes b to path (0600) through a synced temporary file
// in the same directory and a rename, then syncs the directory.
func writeFileAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
