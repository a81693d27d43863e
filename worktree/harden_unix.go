//go:build unix

package worktree

// noHooksDir is where git looks for hooks: a path below /dev/null, which
// can hold no file, so no hook is ever found (git's own suggestion for
// turning hooks off).
func (g Git) noHooksDir() (string, error) { return "/dev/null", nil }
