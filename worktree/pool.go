package worktree

// The pool of warm worktrees: a finished job's worktree is kept for the next
// job on the same repository, which resets it (Reset) instead of checking
// out every file again (Add).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PoolDirName is the folder under aq's worktrees directory that holds the
// pools, one folder per repository: <worktrees>/.pool/<repo>/<n>. Its name
// starts with a dot, so it can never be taken for a repository's folder of
// job worktrees (<worktrees>/<repo>/<job-id>).
const PoolDirName = ".pool"

// discardPrefix names a pooled worktree that could not be reset nor
// removed (a file in it cannot be deleted): it is moved aside under this
// name in the pool folder, out of git's list, for gc to delete.
const discardPrefix = ".discard-"

// PoolDir is the pool folder of repo under worktreesDir.
func PoolDir(worktreesDir, repo string) string {
	return filepath.Join(worktreesDir, PoolDirName, repo)
}

// Pool is one repository's pool of warm worktrees. Every method expects the
// caller to hold the repository's lock (LockRepo): jobs of one repository
// never take from or give to its pool at the same time, and gc trims it
// under the same lock.
//
// A pooled worktree is a registered linked worktree of the repository at
// Dir/<n>, with a detached HEAD (so it holds no branch), whose directory's
// modification time says when it was pooled. What it holds is the last job's
// files, which that job checkpointed before giving it back: nothing in it is
// the only copy of anything.
type Pool struct {
	Dir string // PoolDir(worktrees, repo)
	// Size is the most worktrees the pool keeps; 0 turns pooling off.
	Size int
	// Now is the clock for pooled-at times (default time.Now).
	Now func() time.Time
}

// Pooled is one worktree in a pool.
type Pooled struct {
	Path     string
	PooledAt time.Time
}

// List returns the pool's worktrees, newest first. Folders set aside by a
// failed discard are not in it (see Discarded).
func (p Pool) List() ([]Pooled, error) {
	ents, err := os.ReadDir(p.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Pooled
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, Pooled{Path: filepath.Join(p.Dir, e.Name()), PooledAt: fi.ModTime()})
	}
	slices.SortFunc(out, func(a, b Pooled) int { return b.PooledAt.Compare(a.PooledAt) })
	return out, nil
}

// Discarded lists the folders a failed discard set aside (see Pool); gc
// deletes them.
func (p Pool) Discarded() []string {
	ents, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), discardPrefix) {
			out = append(out, filepath.Join(p.Dir, e.Name()))
		}
	}
	return out
}

func (p Pool) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Put gives the worktree at path (a linked worktree of repoDir whose work is
// recorded: its job's checkpoint was taken) to the pool: `git worktree move`
// to Dir/<n>, then HEAD is detached at the commit it is on, so that the job's
// branch is checked out nowhere. It returns where the worktree went, or ""
// with no error when the pool is off or full (the worktree stays where it
// is). An error means git refused the move (a populated submodule, a locked
// worktree, ...): the worktree stays where it is, as it was.
func (p Pool) Put(ctx context.Context, g Git, repoDir, path string) (string, error) {
	if p.Size <= 0 {
		return "", nil
	}
	pooled, err := p.List()
	if err != nil {
		return "", err
	}
	if len(pooled) >= p.Size {
		return "", nil
	}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return "", err
	}
	// What git clean cannot see (a FIFO, a socket) does not go into the
	// pool with the worktree (special.go).
	if _, err := RemoveSpecialFiles(path); err != nil {
		return "", err
	}
	dest := p.freeName()
	if err := move(ctx, g, repoDir, path, dest); err != nil {
		return "", err
	}
	// The pooled-at time is the folder's mtime: set it before anything else
	// can fail, so that gc always sees a true age.
	now := p.now()
	_ = os.Chtimes(dest, now, now)
	if _, err := g.at(dest).Run(ctx, dest, "update-ref", "--no-deref", "-m", "aq: worktree pooled", "HEAD", "HEAD"); err != nil {
		// Still a pooled worktree: the next Reset moves HEAD anyway; until
		// then the branch stays checked out here (gc keeps it).
		return dest, fmt.Errorf("pooled %s, but its HEAD could not be detached: %w", dest, err)
	}
	return dest, nil
}

// freeName is the lowest unused Dir/<n>.
func (p Pool) freeName() string {
	for n := 0; ; n++ {
		dest := filepath.Join(p.Dir, strconv.Itoa(n))
		if _, err := os.Lstat(dest); errors.Is(err, fs.ErrNotExist) {
			return dest
		}
	}
}

// Take moves the newest pooled worktree to dest (`git worktree move`) and
// reports whether there was one. A pooled worktree git refuses to move is
// discarded and the next one is tried. dest must not exist.
func (p Pool) Take(ctx context.Context, g Git, repoDir, dest string) (ok bool, discarded []error, err error) {
	if p.Size <= 0 {
		return false, nil, nil
	}
	pooled, err := p.List()
	if err != nil {
		return false, nil, err
	}
	for _, w := range pooled {
		if err := ctx.Err(); err != nil {
			return false, discarded, err
		}
		merr := move(ctx, g, repoDir, w.Path, dest)
		if merr == nil {
			return true, discarded, nil
		}
		if ctx.Err() != nil {
			return false, discarded, ctx.Err()
		}
		discarded = append(discarded, &UncleanError{Path: w.Path, Why: "git cannot move it out of the pool", Err: merr})
		if err := p.Discard(ctx, g, repoDir, w.Path); err != nil {
			discarded = append(discarded, err)
		}
	}
	return false, discarded, nil
}

// Discard deletes a worktree of repoDir that will not be reused: `git
// worktree remove --force`, else (git refuses a broken worktree) the folder
// is deleted and `git worktree prune` forgets it. If a file in it cannot be
// deleted, the worktree is moved aside into the pool folder under a
// ".discard-" name, so that its path is free again; gc deletes it later.
// Only for worktrees aq owns outright (pooled, or just taken from the pool):
// what is in them is recorded elsewhere. An error means it is still at path.
func (p Pool) Discard(ctx context.Context, g Git, repoDir, path string) error {
	rmErr := Remove(ctx, g, repoDir, path)
	if rmErr == nil {
		return nil
	}
	if err := os.RemoveAll(path); err == nil {
		return Prune(ctx, g, repoDir)
	}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return fmt.Errorf("cannot remove %s (%v), nor set it aside: %w", path, rmErr, err)
	}
	aside, err := os.MkdirTemp(p.Dir, discardPrefix)
	if err != nil {
		return fmt.Errorf("cannot remove %s (%v), nor set it aside: %w", path, rmErr, err)
	}
	if err := os.Rename(path, filepath.Join(aside, "w")); err != nil {
		return fmt.Errorf("cannot remove %s (%v), nor set it aside: %w", path, rmErr, err)
	}
	// Its registration now points at nothing: prune drops it (and its git
	// directory), which frees its branch.
	if err := Prune(ctx, g, repoDir); err != nil {
		return fmt.Errorf("set %s aside in %s, but cannot unregister it: %w", path, aside, err)
	}
	return nil
}

// move is `git worktree move from to`, run in repoDir. git checks that from
// is a worktree of repoDir that is not locked and has no populated
// submodule, and that to does not exist; the stat data in its index stays
// valid (a rename does not change the files).
func move(ctx context.Context, g Git, repoDir, from, to string) error {
	absFrom, err := filepath.Abs(from)
	if err != nil {
		return err
	}
	absTo, err := filepath.Abs(to)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(absTo), 0o755); err != nil {
		return err
	}
	_, err = g.at(repoDir).Run(ctx, repoDir, "worktree", "move", "--end-of-options", absFrom, absTo)
	return err
}

// CheckoutResult says how Checkout made a worktree.
type CheckoutResult struct {
	// Reused: a pooled worktree was reset for the job.
	Reused bool
	// Discarded are pooled worktrees that could not be reused, and why
	// (the job got a new one).
	Discarded []error
}

// Checkout makes path a worktree of repoDir on branch (created or reset) at
// start: a pooled worktree brought to start by Reset when there is one,
// else a new one (Add). A pooled worktree that cannot be made clean is
// discarded and a new one made in its place. The caller holds the repo lock;
// path must not exist (Add's errors apply).
func (p Pool) Checkout(ctx context.Context, g Git, repoDir, path, branch, start string) (CheckoutResult, error) {
	TrustRepo(repoDir)
	var res CheckoutResult
	sha := start
	if !isFullSHA(start) {
		// A name: resolve it once (a sha the caller resolved is taken as
		// it is; git checkout and Add refuse one that is not a commit).
		if err := CheckRepo(ctx, g, repoDir); err != nil {
			return res, err
		}
		s, ok, err := ResolveRef(ctx, g, repoDir, start)
		if err != nil {
			return res, err
		}
		if !ok {
			return res, &RepoError{Dir: repoDir, Ref: start, Err: ErrNoRef}
		}
		sha = s
	}
	if _, err := os.Lstat(path); err == nil {
		abs, _ := filepath.Abs(path)
		return res, &PathExistsError{Path: abs}
	}
	took, discarded, err := p.Take(ctx, g, repoDir, path)
	res.Discarded = discarded
	if err != nil {
		return res, err
	}
	if took {
		rerr := Reset(ctx, g, path, branch, sha)
		if rerr == nil {
			res.Reused = true
			return res, nil
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		res.Discarded = append(res.Discarded, rerr)
		if err := p.Discard(ctx, g, repoDir, path); err != nil {
			return res, err
		}
	}
	return res, Add(ctx, g, repoDir, path, branch, sha)
}

// isFullSHA reports whether s is a full object name (SHA-1 or SHA-256).
func isFullSHA(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
