package peer

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gofrs/flock"
	"github.com/libp2p/go-libp2p/core/crypto"
)

// IdentityFile is the name of the identity key inside a data directory.
const IdentityFile = "identity.key"

const lockFile = "node.lock"

// ErrInsecureKey is returned when an identity key can be read by group or
// others: a leaked key lets anyone impersonate the node.
var ErrInsecureKey = errors.New("identity key is readable by other users")

// ErrNoIdentity is returned by LoadIdentity when the data dir has no key.
var ErrNoIdentity = errors.New("no identity key")

// ErrDataDirLocked is returned when another live process holds the data dir.
var ErrDataDirLocked = errors.New("data dir is in use by another holopeer process")

// LoadIdentity reads the Ed25519 identity key in dir. It refuses a key
// file that group or others may read.
func LoadIdentity(dir string) (crypto.PrivKey, error) {
	path := filepath.Join(dir, IdentityFile)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (create one with `holopeer keygen --data-dir %s`)", ErrNoIdentity, dir, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o; run `chmod 600 %s`", ErrInsecureKey, path, perm, path)
	}
	if fi.Size() > 4096 {
		return nil, fmt.Errorf("identity: %s is %d bytes, not a key", path, fi.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	key, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("identity: %s is not a libp2p private key: %w", path, err)
	}
	if key.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("identity: %s holds a %s key, want Ed25519", path, key.Type())
	}
	return key, nil
}

// CreateIdentity writes a new Ed25519 identity key into dir (mode 0600,
// directory 0700). It refuses to overwrite an existing key. The key is
// written to a temporary file, synced, and then linked into place, so a
// crash leaves either no key or the whole key, never a torn one (which
// would give the node a new identity, or none, at its next start).
func CreateIdentity(dir string) (crypto.PrivKey, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identity: create data dir: %w", err)
	}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("identity: marshal: %w", err)
	}
	path := filepath.Join(dir, IdentityFile)
	if err := writeNewFile(path, b); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("identity: %s already exists; refusing to overwrite it", path)
		}
		return nil, fmt.Errorf("identity: write %s: %w", path, err)
	}
	return key, nil
}

// writeNewFile writes b to path (0600) unless path exists: into a synced
// temporary file beside it, then a hard link, which (unlike rename) fails
// if path appeared meanwhile, then a sync of the directory so the link
// itself survives a crash.
func writeNewFile(path string, b []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		// A file system without hard links: rename, having checked.
		if _, serr := os.Lstat(path); serr == nil {
			return fs.ErrExist
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// LoadOrCreateIdentity loads the key in dir, creating one on first use.
func LoadOrCreateIdentity(dir string) (crypto.PrivKey, error) {
	key, err := LoadIdentity(dir)
	if errors.Is(err, ErrNoIdentity) {
		return CreateIdentity(dir)
	}
	return key, err
}

// dirLock is an exclusive lock on a data dir, released when the process
// exits even if it crashes: flock(2) on Unix, LockFileEx on Windows, both
// tied to the open file (github.com/gofrs/flock).
type dirLock struct{ l *flock.Flock }

// pidFile names the process holding a data dir's lock, for the error a
// second one gets. A file of its own: on Windows the locked file cannot
// be read by another process.
const pidFile = "node.pid"

// lockDataDir takes the data dir's lock or reports who holds it.
func lockDataDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	l := flock.New(filepath.Join(dir, lockFile), flock.SetPermissions(0o600))
	ok, err := l.TryLock()
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if !ok {
		b, _ := os.ReadFile(filepath.Join(dir, pidFile))
		holder := strings.TrimSpace(string(b))
		if _, perr := strconv.Atoi(holder); perr != nil {
			holder = "unknown"
		}
		return nil, fmt.Errorf("%w: %s is locked by pid %s; stop that node or use another --data-dir", ErrDataDirLocked, dir, holder)
	}
	_ = os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	return &dirLock{l: l}, nil
}

func (l *dirLock) release() {
	if l == nil || l.l == nil {
		return
	}
	_ = l.l.Unlock()
	l.l = nil
}
