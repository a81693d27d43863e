package worktree

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/aqfleet/aq/internal/brief"
)

// Sentinels for errors.Is. Both mean the repository cannot be used for the
// job as asked (aq's caller reports them as repo_unavailable).
var (
	// ErrNotRepo: the directory is missing or is not a git repository.
	ErrNotRepo = errors.New("not a git repository")
	// ErrNoRef: a ref the operation starts from does not exist.
	ErrNoRef = errors.New("ref does not exist")
)

// RepoError says that a repository cannot be used: Dir is missing or not a
// repository (Err is ErrNotRepo), or Ref does not exist in it (Err is
// ErrNoRef). Cause, when set, is what git or the OS said.
type RepoError struct {
	Dir   string
	Ref   string
	Err   error // ErrNotRepo or ErrNoRef
	Cause error
}

func (e *RepoError) Error() string {
	var msg string
	switch {
	case errors.Is(e.Err, ErrNoRef):
		msg = fmt.Sprintf("repository %s has no branch or ref %q", e.Dir, e.Ref)
	case errors.Is(e.Cause, fs.ErrNotExist):
		msg = fmt.Sprintf("repository %s does not exist", e.Dir)
	default:
		msg = fmt.Sprintf("%s is not a git repository", e.Dir)
	}
	if e.Cause != nil && !errors.Is(e.Cause, fs.ErrNotExist) {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap exposes both the sentinel and the cause to errors.Is/As.
func (e *RepoError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

// PathExistsError is returned by Add when the worktree path is already taken.
// It matches fs.ErrExist. The caller decides what to do with the old
// directory (checkpoint it, then Remove it, typically).
type PathExistsError struct{ Path string }

func (e *PathExistsError) Error() string {
	return fmt.Sprintf("worktree path %s already exists", e.Path)
}

func (e *PathExistsError) Unwrap() error { return fs.ErrExist }

// PartialError is returned with a checkpoint that was recorded but could not
// include every file: git could not index some of them (an unreadable file, a
// nested repository with no commit). SHA is the checkpoint that was written;
// Err says what was left out.
type PartialError struct {
	SHA string
	Err error
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("checkpoint %s is missing some files: %v", brief.SHA(e.SHA), e.Err)
}

func (e *PartialError) Unwrap() error { return e.Err }

// PushError is a push that git ran but the remote refused for some refs
// (non-fast-forward, a protected branch, a hook). Err is the git failure.
type PushError struct {
	Remote   string
	Rejected []RefUpdate
	Err      error
}

// RefUpdate is one line of `git push --porcelain`.
type RefUpdate struct {
	Flag    string // " " fast-forward, "+" forced, "-" deleted, "*" new, "=" up to date, "!" rejected
	Src     string
	Dst     string
	Summary string
}

func (e *PushError) Error() string {
	var parts []string
	for _, r := range e.Rejected {
		parts = append(parts, r.Dst+" "+r.Summary)
	}
	return fmt.Sprintf("push to %s rejected: %s", e.Remote, strings.Join(parts, "; "))
}

func (e *PushError) Unwrap() error { return e.Err }
