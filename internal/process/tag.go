package process

import (
	"context"
	"path/filepath"
	"strings"
	"time"
)

// KillTagged sends SIGTERM to every live process carrying TagEnv=tag, then
// SIGKILL to those still alive grace later (at once for a grace of 0), and
// waits until none is left; a zombie counts as gone. When ctx is done the
// rest of the grace period is skipped: survivors get SIGKILL at once. It
// returns how many tagged processes it found, and an error if they could not
// be looked for or some outlived SIGKILL by seconds.
//
// The runner uses it for the orphans of an aq that was killed; Run does the
// same after every process. On platforms without /proc it returns 0 and an
// error wrapping errors.ErrUnsupported.
func KillTagged(ctx context.Context, tag string, grace time.Duration) (int, error) {
	return KillScoped(ctx, tag, "", grace)
}

// KillScoped is KillTagged limited to processes that also carry
// ScopeEnv=scope (any scope when scope is empty): one aq home's job never
// kills another home's job of the same id.
func KillScoped(ctx context.Context, tag, scope string, grace time.Duration) (int, error) {
	if tag == "" {
		return 0, errNoTag
	}
	return sweep(ctx, wants(tag, scope), grace, 0)
}

// ScopeEnv is the environment variable that says which aq (by its home)
// started a process. Job ids are unique per aq home, not per host.
const ScopeEnv = "AQ_SCOPE"

// RunEnv marks the processes of one Run (one engine or verify run of a
// job): a supervisor sweeps only its own run's, so a dead aq's supervisor
// never stops the next run of the same job that recovery started meanwhile.
const RunEnv = "AQ_PROCESS_RUN"

// tagEntry is the environment entry that marks a job's processes.
func tagEntry(tag string) []byte { return []byte(TagEnv + "=" + tag) }

// wants are the entries a process must carry to be a job's: the tag, and
// the scope when there is one.
func wants(tag, scope string) [][]byte {
	w := [][]byte{tagEntry(tag)}
	if scope != "" {
		w = append(w, []byte(ScopeEnv+"="+scope))
	}
	return w
}

// StopScoped takes every live process carrying TagEnv=tag (and
// ScopeEnv=scope, when set) through the kill ladder Run uses for an engine —
// SIGINT, grace, SIGTERM, grace, then SIGKILL and a wait until none is left —
// so an orphaned engine can finish its own clean-up, as it could under a
// live aq. Orphan recovery and an engine's supervisor use it. It returns how
// many tagged processes it found; errors as KillScoped.
func StopScoped(ctx context.Context, tag, scope string, grace time.Duration) (int, error) {
	if tag == "" {
		return 0, errNoTag
	}
	return stopLadder(ctx, wants(tag, scope), grace)
}

// within reports whether path is dir or below it (both absolute and
// clean).
func within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return path == dir || strings.HasPrefix(path, dir+string(filepath.Separator))
}
