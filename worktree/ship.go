package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aqfleet/aq/internal/brief"
)

// Commits and pushes aq makes skip the repository's hooks (--no-verify): the
// job's own `verify:` command is the gate, a WIP checkpoint is unfinished by
// definition, and a hook written for a person at a terminal (a prompt, a
// formatter that rewrites files) has no place in a headless run. Signing
// follows the repository's configuration for the commit that ships; WIP
// checkpoints are never signed (no pinentry on a factory host).

// CommitAll stages everything in the worktree (`git add --all`: tracked
// changes, deletions, untracked files; not ignored ones) and commits it on the
// current branch. changed is false, and no commit is made, when there was
// nothing to commit; sha is then HEAD as it is ("" on an unborn branch).
func CommitAll(ctx context.Context, g Git, wtPath, message string) (sha string, changed bool, err error) {
	wg := g.at(wtPath)
	_, _ = RemoveSpecialFiles(wtPath) // special.go
	if _, err := wg.Run(ctx, wtPath, "add", "--all"); err != nil {
		return "", false, err
	}
	changed, err = staged(ctx, wg, wtPath)
	if err != nil || !changed {
		head, _, rerr := ResolveRef(ctx, g, wtPath, "HEAD")
		return head, false, errors.Join(err, rerr)
	}
	if err := commit(ctx, g, wtPath, message); err != nil {
		return "", false, err
	}
	head, _, err := ResolveRef(ctx, g, wtPath, "HEAD")
	return head, true, err
}

// SquashOnto makes the worktree's branch baseSHA plus one commit holding
// everything in the worktree, however many commits (the engine's, or WIP
// checkpoints a resumed job started from) sit between them: `git add --all`,
// `git reset --soft baseSHA`, `git commit`. baseSHA must be an ancestor of
// HEAD (the commit the job started from, or `MergeBase(HEAD, base)`): squashing
// onto a base that moved on would silently revert the base's new commits, so
// that is refused. changed is false, and the branch is left at baseSHA, when
// the result would be no change from it. If the commit fails, the branch is
// put back where it was.
func SquashOnto(ctx context.Context, g Git, wtPath, baseSHA, message string) (sha string, changed bool, err error) {
	wg := g.at(wtPath)
	_, _ = RemoveSpecialFiles(wtPath) // special.go
	base, ok, err := ResolveRef(ctx, g, wtPath, baseSHA)
	if err != nil {
		return "", false, err
	}
	if !ok {
		return "", false, &RepoError{Dir: wtPath, Ref: baseSHA, Err: ErrNoRef}
	}
	head, ok, err := ResolveRef(ctx, g, wtPath, "HEAD")
	if err != nil {
		return "", false, err
	}
	if !ok {
		return "", false, fmt.Errorf("squash in %s: the branch has no commit yet", wtPath)
	}
	anc, err := IsAncestor(ctx, g, wtPath, base, head)
	if err != nil {
		return "", false, err
	}
	if !anc {
		return "", false, fmt.Errorf("squash in %s: %s is not an ancestor of HEAD %s (squashing onto it would revert its changes; use the merge base)", wtPath, brief.SHA(base), brief.SHA(head))
	}
	if _, err := wg.Run(ctx, wtPath, "add", "--all"); err != nil {
		return "", false, err
	}
	if _, err := wg.Run(ctx, wtPath, "reset", "--soft", base); err != nil { // base: a resolved sha
		return "", false, err
	}
	changed, err = staged(ctx, wg, wtPath)
	if err != nil {
		return "", false, rollback(ctx, wg, wtPath, head, err)
	}
	if !changed {
		return base, false, nil
	}
	if err := commit(ctx, g, wtPath, message); err != nil {
		return "", false, rollback(ctx, wg, wtPath, head, err)
	}
	sha, _, err = ResolveRef(ctx, g, wtPath, "HEAD")
	return sha, true, err
}

func rollback(ctx context.Context, wg Git, wtPath, head string, cause error) error {
	if _, err := wg.Run(ctx, wtPath, "reset", "--soft", head); err != nil {
		return errors.Join(cause, fmt.Errorf("restore branch to %s: %w", brief.SHA(head), err))
	}
	return cause
}

// staged reports whether the index differs from HEAD (or, on an unborn
// branch, holds anything).
func staged(ctx context.Context, wg Git, wtPath string) (bool, error) {
	_, err := wg.Run(ctx, wtPath, "diff", "--cached", "--quiet", "--no-ext-diff")
	switch {
	case err == nil:
		return false, nil
	case exitCode(err) == 1:
		return true, nil
	}
	return false, err
}

func commit(ctx context.Context, g Git, wtPath, message string) error {
	if strings.TrimSpace(message) == "" {
		return errors.New("commit: empty message")
	}
	id, err := g.identity(ctx, wtPath)
	if err != nil {
		return err
	}
	args := append(id, "commit", "--quiet", "--no-verify", "--no-edit", "-m", message)
	_, err = g.at(wtPath).Run(ctx, wtPath, args...)
	return err
}

// DiffStat counts the change from commit from to commit to, as `git diff
// --numstat` sees it without rename detection: files changed (binary files
// included; they add no lines), lines added, lines deleted.
func DiffStat(ctx context.Context, g Git, dir, from, to string) (files, added, deleted int, err error) {
	out, err := g.at(dir).run(ctx, dir, nil, []string{
		"diff", "--numstat", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", "--end-of-options", from, to, "--",
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return parseNumstat(out)
}

// parseNumstat reads `git diff --numstat -z --no-renames`: one
// "added<TAB>deleted<TAB>path<NUL>" per file, "-" for binary counts.
func parseNumstat(out []byte) (files, added, deleted int, err error) {
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		f := strings.SplitN(string(rec), "\t", 3)
		if len(f) != 3 {
			return 0, 0, 0, fmt.Errorf("diff --numstat: unexpected record %q", rec)
		}
		files++
		if f[0] == "-" && f[1] == "-" {
			continue // binary
		}
		a, err1 := strconv.Atoi(f[0])
		d, err2 := strconv.Atoi(f[1])
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, 0, fmt.Errorf("diff --numstat: %w", err)
		}
		added += a
		deleted += d
	}
	return files, added, deleted, nil
}

// Dirty reports whether the worktree has anything not committed: changes,
// deletions or untracked files (ignored files do not count). It takes no
// optional locks, so it neither waits on nor rewrites the worktree's index.
func Dirty(ctx context.Context, g Git, wtPath string) (bool, error) {
	_, _ = RemoveSpecialFiles(wtPath) // special.go
	out, err := g.at(wtPath).run(ctx, wtPath, nil, []string{
		"--no-optional-locks", "status", "--porcelain", "-z", "--untracked-files=normal", "--ignore-submodules=none",
	})
	if err != nil {
		return false, notRepo(ctx, wtPath, err)
	}
	return len(bytes.TrimSpace(out)) > 0, nil
}
