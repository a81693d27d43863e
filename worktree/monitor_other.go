//go:build !linux

package worktree

import (
	"context"
	"errors"
	"fmt"
	"runtime"
)

// monitor needs inotify (Linux). Elsewhere a Checkpointer works from git's
// stat cache and untracked cache alone.
type monitor struct{}

func startMonitor(root, cookieDir string) (*monitor, error) {
	return nil, fmt.Errorf("watching a worktree on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func (m *monitor) sync(context.Context) (uint64, error) { return 0, errors.ErrUnsupported }
func (m *monitor) since(uint64) ([]string, bool)        { return nil, false }
func (m *monitor) close()                               {}
