//go:build !linux && !darwin

package process

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// waitExited is not available here: Run reaps the child first and kills the
// rest of its group afterwards.
func waitExited(int) bool { return false }

var errNoProc = fmt.Errorf("process: finding tagged processes on %s: %w", runtime.GOOS, errors.ErrUnsupported)

// FindTagged needs /proc/<pid>/environ, which only Linux has; elsewhere it
// returns errors.ErrUnsupported, and Run cleans up only the process group.
func FindTagged(tag string) ([]int, error) { return FindScoped(tag, "") }

// FindScoped: see the Linux version.
func FindScoped(tag, scope string) ([]int, error) {
	if tag == "" {
		return nil, errNoTag
	}
	return nil, errNoProc
}

func sweep(context.Context, [][]byte, time.Duration, int) (int, error) { return 0, errNoProc }

func stopLadder(context.Context, [][]byte, time.Duration) (int, error) { return 0, errNoProc }

// WorkingIn needs /proc/<pid>/cwd; elsewhere it returns
// errors.ErrUnsupported.
func WorkingIn(dir string) ([]int, error) { return nil, errNoProc }
