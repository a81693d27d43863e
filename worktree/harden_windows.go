package worktree

import (
	"os"
	"path/filepath"
)

// noHooksDir is where git looks for hooks: an empty folder of aq's own
// (Windows has no /dev/null to point at).
func (g Git) noHooksDir() (string, error) {
	dir, err := g.configDir()
	if err != nil {
		return "", err
	}
	hooks := filepath.Join(dir, "no-hooks")
	if err := os.MkdirAll(hooks, 0o700); err != nil {
		return "", err
	}
	return hooks, nil
}
