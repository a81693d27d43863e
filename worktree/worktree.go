package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// IsRepo reports whether dir is itself a git repository: a checkout with a
// .git directory, a linked worktree or submodule with a .git file, or a bare
// repository. It only looks at the file system (no git process), so it is
// cheap enough to scan every folder under a repo base; a folder inside some
// other repository is not a repository. CheckRepo asks git itself.
func IsRepo(dir string) bool {
	dotgit := filepath.Join(dir, ".git")
	fi, err := os.Stat(dotgit)
	switch {
	case err == nil && fi.IsDir():
		return isGitDir(dotgit)
	case err == nil && fi.Mode().IsRegular():
		b, err := os.ReadFile(dotgit)
		if err != nil {
			return false
		}
		target, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir:")
		if !ok {
			return false
		}
		target = strings.TrimSpace(target)
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		return fileExists(filepath.Join(target, "HEAD"))
	}
	return isGitDir(dir) // bare
}

// IsGitDir is git's own test for a git directory, less HEAD's contents:
// HEAD, objects/ and refs/ are there. A .git that a clone in progress has
// only just made is not one yet.
func IsGitDir(dir string) bool { return isGitDir(dir) }

func isGitDir(dir string) bool {
	return fileExists(filepath.Join(dir, "HEAD")) && dirExists(filepath.Join(dir, "objects")) && dirExists(filepath.Join(dir, "refs"))
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// CheckRepo asks git whether dir is a usable repository (or worktree) root.
// It returns a *RepoError matching ErrNotRepo when dir is missing, is not a
// repository, or git refuses it (for instance "detected dubious ownership":
// the message then says so).
func CheckRepo(ctx context.Context, g Git, dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return &RepoError{Dir: dir, Err: ErrNotRepo, Cause: err}
	}
	if _, err := g.at(dir).Run(ctx, dir, "rev-parse", "--git-dir"); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return &RepoError{Dir: dir, Err: ErrNotRepo, Cause: err}
	}
	return nil
}

// ResolveRef resolves ref (a branch, a full ref, a sha, "HEAD", ...) in the
// repository or worktree dir to the commit it names. ok is false, with no
// error, when ref does not exist (or names something that is not a commit);
// an error means git itself failed (dir is not a repository, ...).
func ResolveRef(ctx context.Context, g Git, dir, ref string) (sha string, ok bool, err error) {
	out, err := g.at(dir).Run(ctx, dir, "rev-parse", "-q", "--verify", "--end-of-options", ref+"^{commit}")
	if err != nil {
		if exitCode(err) == 1 { // --verify -q: "not a valid object name", nothing on stderr
			return "", false, nil
		}
		return "", false, err
	}
	return out, true, nil
}

// BranchExists reports whether refs/heads/<branch> exists in dir.
func BranchExists(ctx context.Context, g Git, dir, branch string) (bool, error) {
	_, ok, err := ResolveRef(ctx, g, dir, "refs/heads/"+strings.TrimPrefix(branch, "refs/heads/"))
	return ok, err
}

// HasRemote reports whether dir has a remote called name. Any failure
// (dir is not a repository, ...) reads as "no".
//
// A remote is any remote.<name>.* key of the configuration, as `git
// remote` lists it: read from the cached configuration (no git of its own,
// #35) when it names one; else `git remote` answers (a remote git also
// finds in the legacy .git/remotes/ files).
func HasRemote(ctx context.Context, g Git, dir, name string) bool {
	if entries, ok, err := g.listing(ctx, dir); err == nil && ok {
		for _, e := range entries {
			if sec, sub, _ := splitKey(e.key); sec == "remote" && sub == name {
				return true
			}
		}
	}
	out, err := g.at(dir).Run(ctx, dir, "remote")
	if err != nil {
		return false
	}
	for _, r := range strings.Split(out, "\n") {
		if r == name {
			return true
		}
	}
	return false
}

// IsAncestor reports whether commit a is an ancestor of (or equal to) b.
func IsAncestor(ctx context.Context, g Git, dir, a, b string) (bool, error) {
	_, err := g.at(dir).Run(ctx, dir, "merge-base", "--is-ancestor", "--end-of-options", a, b)
	switch {
	case err == nil:
		return true, nil
	case exitCode(err) == 1:
		return false, nil
	}
	return false, err
}

// MergeBase is the best common ancestor of a and b; ok is false when they
// have none.
func MergeBase(ctx context.Context, g Git, dir, a, b string) (sha string, ok bool, err error) {
	out, err := g.at(dir).Run(ctx, dir, "merge-base", "--end-of-options", a, b)
	switch {
	case err == nil:
		return out, true, nil
	case exitCode(err) == 1:
		return "", false, nil
	}
	return "", false, err
}

// Add creates a linked worktree of the repository repoDir at path, on branch
// (created, or reset if it exists) at startRef: `git worktree add -B branch
// path <sha of startRef>`. Parent directories of path are created.
//
// Errors the caller must tell apart:
//   - *RepoError matching ErrNotRepo: repoDir is missing or not a repository;
//   - *RepoError matching ErrNoRef (Ref is startRef): the start ref is missing;
//   - *PathExistsError (matches fs.ErrExist): path exists. Add never reuses
//     or deletes an existing directory: it may hold work; the caller
//     checkpoints and removes a stale one.
//
// If branch is checked out in another live worktree (a stale worktree of the
// same job at another path), git refuses and the *GitError says where; List
// finds it.
//
// Before adding, registrations of worktrees whose directories are gone are
// pruned (`git worktree prune`), so a worktree deleted by hand does not keep
// its branch "checked out". Add touches nothing in repoDir's own checkout:
// its files, index and HEAD stay as they are. The caller holds the repo lock.
func Add(ctx context.Context, g Git, repoDir, path, branch, startRef string) error {
	if err := CheckRepo(ctx, g, repoDir); err != nil {
		return err
	}
	TrustRepo(repoDir)
	abs, err := filepath.Abs(path) // git would resolve a relative path against repoDir
	if err != nil {
		return err
	}
	if _, err := os.Lstat(abs); err == nil {
		return &PathExistsError{Path: abs}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	sha, ok, err := ResolveRef(ctx, g, repoDir, startRef)
	if err != nil {
		return err
	}
	if !ok {
		return &RepoError{Dir: repoDir, Ref: startRef, Err: ErrNoRef}
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return fmt.Errorf("create worktree parent: %w", err)
	}
	rg := g.at(repoDir)
	if _, err := rg.Run(ctx, repoDir, "worktree", "prune"); err != nil {
		return err
	}
	_, err = rg.Run(ctx, repoDir, "worktree", "add", "--quiet", "-B", branch, "--end-of-options", abs, sha)
	return err
}

// Remove deletes the worktree at path and its registration in repoDir
// (`git worktree remove --force`, then `git worktree prune`). Files in it that
// are not committed or checkpointed are lost: checkpoint first. A worktree
// whose directory was already deleted by hand is just unregistered. A locked
// worktree (`git worktree lock`) is not removed.
func Remove(ctx context.Context, g Git, repoDir, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	rg := g.at(repoDir)
	_, rmErr := rg.Run(ctx, repoDir, "worktree", "remove", "--force", "--end-of-options", abs)
	if _, err := rg.Run(ctx, repoDir, "worktree", "prune"); err != nil {
		return err
	}
	if rmErr != nil {
		if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
			return nil // gone by hand; prune unregistered it
		}
		return rmErr
	}
	return nil
}

// Prune unregisters worktrees whose directories are gone (`git worktree
// prune`); locked ones are kept.
func Prune(ctx context.Context, g Git, repoDir string) error {
	_, err := g.at(repoDir).Run(ctx, repoDir, "worktree", "prune")
	return err
}

// Entry is one worktree of a repository, from `git worktree list --porcelain`.
type Entry struct {
	Path     string
	Branch   string // short name ("aq/job/x"); empty when detached or bare
	HEAD     string // empty in a bare repository or on an unborn branch
	Detached bool
	Bare     bool
	Locked   bool
	Prunable bool // its directory is gone; `git worktree prune` would drop it
}

// List returns the worktrees of repoDir, the main one first.
func List(ctx context.Context, g Git, repoDir string) ([]Entry, error) {
	out, err := g.at(repoDir).run(ctx, repoDir, nil, []string{"worktree", "list", "--porcelain", "-z"})
	if err != nil {
		return nil, err
	}
	return parseWorktreeList(out), nil
}

// parseWorktreeList reads `git worktree list --porcelain -z`: attributes end
// with NUL, a record with an empty attribute.
func parseWorktreeList(out []byte) []Entry {
	var entries []Entry
	var cur *Entry
	for _, f := range bytes.Split(out, []byte{0}) {
		line := string(f)
		if line == "" {
			cur = nil
			continue
		}
		key, val, _ := strings.Cut(line, " ")
		if key == "worktree" {
			entries = append(entries, Entry{Path: val})
			cur = &entries[len(entries)-1]
			continue
		}
		if cur == nil {
			continue
		}
		switch key {
		case "HEAD":
			if strings.Trim(val, "0") != "" {
				cur.HEAD = val
			}
		case "branch":
			cur.Branch = strings.TrimPrefix(val, "refs/heads/")
		case "detached":
			cur.Detached = true
		case "bare":
			cur.Bare = true
		case "locked":
			cur.Locked = true
		case "prunable":
			cur.Prunable = true
		}
	}
	return entries
}

// ResolveRefs resolves each of refs (full ref names) in dir to the commit it
// names, in one git (`git cat-file --batch-check`, as ResolveRef's
// `rev-parse --verify` of each would, #35): what does not exist, or names
// no commit, is left out of the map. An error means git itself failed.
func ResolveRefs(ctx context.Context, g Git, dir string, refs ...string) (map[string]string, error) {
	var in strings.Builder
	for _, r := range refs {
		if r == "" || strings.ContainsAny(r, "\n\x00") || strings.HasPrefix(r, "-") {
			return nil, fmt.Errorf("resolve refs: invalid ref %q", r)
		}
		in.WriteString(r + "^{commit}\n")
	}
	out, err := g.runStdin(ctx, dir, strings.NewReader(in.String()), "cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return nil, notRepo(ctx, dir, err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(refs) {
		return nil, fmt.Errorf("resolve refs: git cat-file answered %d lines for %d refs", len(lines), len(refs))
	}
	shas := map[string]string{}
	for i, l := range lines {
		if f := strings.Fields(l); len(f) == 2 && f[1] == "commit" {
			shas[refs[i]] = f[0]
		}
	}
	return shas, nil
}
