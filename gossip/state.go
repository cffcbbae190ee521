package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// electionState is what WithStateFile keeps: the fencing floor.
type electionState struct {
	Swarm       string `json:"swarm"`
	Term        uint64 `json:"term"`
	Coordinator string `json:"coordinator"`
}

const maxStateBytes = 4 << 10

func loadState(path, swarm string) (uint64, string, error) {
	if path == "" {
		return 0, "", nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("gossip: read state: %w", err)
	}
	if len(b) > maxStateBytes {
		return 0, "", fmt.Errorf("gossip: state file %s is %d bytes, expected a few dozen", path, len(b))
	}
	var st electionState
	if err := json.Unmarshal(b, &st); err != nil {
		return 0, "", fmt.Errorf("gossip: state file %s: %w", path, err)
	}
	if st.Swarm != swarm {
		return 0, "", fmt.Errorf("gossip: state file %s is for swarm %q, not %q", path, st.Swarm, swarm)
	}
	if (st.Term == 0) != (st.Coordinator == "") {
		return 0, "", fmt.Errorf("gossip: state file %s: term and coordinator go together", path)
	}
	return st.Term, st.Coordinator, nil
}

func saveState(path, swarm string, term uint64, coord string) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(electionState{Swarm: swarm, Term: term, Coordinator: coord})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".election-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
