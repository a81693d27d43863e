package worktree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aqfleet/aq/internal/safefs"
)

// Checkpoint records everything in the worktree at wtPath — tracked changes,
// deletions and untracked files, but not ignored files — as a commit on ref
// (a full ref, or a branch name such as "aq/wip/<id>") and returns that
// commit. It does not touch the worktree's HEAD, branch, index or files: the
// snapshot is built in a temporary index (a copy of the worktree's index, for
// its stat cache, else `git read-tree HEAD`), then `git add -A`, `git
// write-tree`, `git commit-tree` and `git update-ref`. So it works when a
// killed engine left the worktree's index.lock behind, and it never blocks on
// or disturbs a git command that might still run in the worktree (none
// should: checkpoint after the engine's process group is dead).
//
// Parents (the rule that keeps history from ever being lost):
//   - the first parent is HEAD, so `git diff ref^ ref` is exactly the
//     uncommitted work and a worktree started from the checkpoint has the
//     job's commits in its history;
//   - if ref already points at a commit that is not HEAD and not an ancestor
//     of HEAD (an earlier checkpoint, or one fetched from another factory),
//     that commit becomes the second parent, so it stays reachable from ref.
//
// When nothing changed, no commit is made: if ref already records this exact
// state on top of HEAD, ref is returned as it is; if the worktree equals HEAD
// and ref holds nothing that HEAD lacks, ref is pointed at HEAD. An unborn
// branch with nothing in the worktree has nothing to record: the result is
// "" and ref is left alone. ref is updated with compare-and-swap, so two
// concurrent checkpoints of one ref cannot overwrite each other silently.
//
// Checkpoint commits are never signed (commit-tree --no-gpg-sign: a factory
// host has no one to type a passphrase) and run no hooks. The identity is the
// repository's, else "aq <aq@localhost>".
//
// If git could not index some files (an unreadable file, a nested repository
// without a commit), the rest is still recorded and the error is a
// *PartialError carrying the sha.
func Checkpoint(ctx context.Context, g Git, wtPath, ref, message string) (string, error) {
	sha, _, err := CheckpointSeen(ctx, g, wtPath, ref, message)
	return sha, err
}

// Seen is what a checkpoint read of its worktree, for a caller that acts
// on the worktree right after it (the result commit: #35, no second git to
// read again what the checkpoint's own read just said): HEAD's commit, the
// checkpoint's tree, and the object each name asked for resolves to (""
// for one that does not exist). Only as true as nothing moved since.
type Seen struct {
	Head, Tree string
	Names      map[string]string
	// Parents are the parents of the checkpoint commit when it made one
	// (nil when the checkpoint is HEAD or the ref as it was).
	Parents []string
}

// CheckpointSeen is Checkpoint, also resolving names (refs, or hashes with
// a suffix such as ^{tree}; aq's own, one line each) in the same git that
// reads HEAD and ref.
func CheckpointSeen(ctx context.Context, g Git, wtPath, ref, message string, names ...string) (string, Seen, error) {
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "\n\r") {
			return "", Seen{}, fmt.Errorf("checkpoint: cannot resolve %q", n)
		}
	}
	ref = fullBranchRef(ref)
	wg := g.at(wtPath)
	indexPath, err := indexOf(ctx, wg, wtPath)
	if err != nil {
		return "", Seen{}, notRepo(ctx, wtPath, err)
	}
	r, err := resolveRefs(ctx, wg, wtPath, ref, names...)
	if err != nil {
		return "", Seen{}, err
	}
	sha, tree, made, err := checkpointScan(ctx, g, wtPath, indexPath, ref, message, r)
	return sha, Seen{Head: r.head, Tree: tree, Names: r.extra, Parents: made}, err
}

// checkpointScan is Checkpoint once the index and refs are known, with the
// checkpoint's tree and the parents of the commit it made (nil for none).
func checkpointScan(ctx context.Context, g Git, wtPath, indexPath, ref, message string, r refState) (sha, tree string, made []string, err error) {
	wg := g.at(wtPath)
	tree, partial, err := snapshotTree(ctx, wg, wtPath, indexPath, r.head != "")
	if err != nil {
		return "", "", nil, err
	}
	sha, made, err = recordCheckpoint(ctx, g, wtPath, ref, message, tree, r, nil)
	if err != nil {
		return "", tree, nil, err
	}
	if partial != nil && sha != "" {
		return sha, tree, made, &PartialError{SHA: sha, Err: partial}
	}
	return sha, tree, made, nil
}

// indexOf is the index file of the worktree at wtPath: read from a linked
// worktree's .git file, else asked of git.
func indexOf(ctx context.Context, wg Git, wtPath string) (string, error) {
	if admin, err := linkedGitDir(wtPath); err == nil {
		return filepath.Join(admin, "index"), nil
	}
	p, err := wg.Run(ctx, wtPath, "rev-parse", "--git-path", "index")
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(wtPath, p)
	}
	return p, nil
}

// refState is what a checkpoint needs to know of HEAD and of its ref, read
// in one git process: each commit, its tree, and the ref's first parent
// ("" for what does not exist).
type refState struct {
	head, headTree, prev, prevTree, prevParent string
	// extra are the further names asked for (CheckpointSeen), each the
	// object it names ("" for none).
	extra map[string]string
}

// resolveRefs reads refState, and names, with one `git cat-file
// --batch-check`.
func resolveRefs(ctx context.Context, wg Git, wtPath, ref string, names ...string) (refState, error) {
	in := "HEAD\nHEAD^{tree}\n" + ref + "\n" + ref + "^{tree}\n" + ref + "^\n"
	for _, n := range names {
		in += n + "\n"
	}
	out, err := wg.runStdin(ctx, wtPath, strings.NewReader(in), "cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return refState{}, notRepo(ctx, wtPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != 5+len(names) {
		return refState{}, fmt.Errorf("checkpoint: git cat-file answered %q", out)
	}
	val := func(i int, typ string) string {
		f := strings.Fields(lines[i])
		if len(f) == 2 && f[1] == typ {
			return f[0]
		}
		return "" // "<name> missing", or not a commit
	}
	r := refState{head: val(0, "commit"), headTree: val(1, "tree"), prev: val(2, "commit"), prevTree: val(3, "tree"), prevParent: val(4, "commit")}
	if r.head == "" {
		r.headTree = ""
	}
	if r.prev == "" {
		r.prevTree, r.prevParent = "", ""
	}
	if len(names) > 0 {
		r.extra = map[string]string{}
		for i, n := range names {
			if f := strings.Fields(lines[5+i]); len(f) == 2 && f[1] != "missing" {
				r.extra[n] = f[0]
			} else {
				r.extra[n] = ""
			}
		}
	}
	return r, nil
}

// snapshotTree writes the tree of everything in the worktree, using a
// temporary index in the worktree's own git dir (same file system, and it
// goes away with the worktree). partial is set when `git add` had to leave
// files out.
func snapshotTree(ctx context.Context, wg Git, wtPath, indexPath string, hasHead bool) (tree string, partial error, err error) {
	_, _ = RemoveSpecialFiles(wtPath) // a FIFO .gitignore would hang git add (special.go)
	tmpDir, err := os.MkdirTemp(filepath.Dir(indexPath), "aq-checkpoint-")
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint: temporary index: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tmpIndex := filepath.Join(tmpDir, "index")
	ig := wg.with("GIT_INDEX_FILE=" + tmpIndex)

	// Seeding the temporary index with a copy of the real one lets `git add`
	// skip unchanged files by their stat data instead of hashing the whole
	// tree (6 ms instead of 22 ms for 1000 files here, and it grows with the
	// repository), and keeps skip-worktree entries. The copy keeps the
	// original's mtime, which git's racy-entry check compares file times
	// against: a fresh mtime would let a file rewritten in the same second as
	// the last index write, with the same size, pass as unchanged. If the
	// copy is unusable (or `git add` fails on it), start again from HEAD.
	copied, err := copyFile(indexPath, tmpIndex)
	if err != nil {
		copied = false
		if err := resetIndex(ctx, ig, wtPath, tmpIndex, hasHead); err != nil {
			return "", nil, err
		}
	}
	addErr := addAll(ctx, ig, wtPath)
	// A failure may come from the copied index (corrupt, or a format this git
	// cannot read) or from files git cannot index; only a fresh index tells.
	if addErr != nil && copied && ctx.Err() == nil {
		if err := resetIndex(ctx, ig, wtPath, tmpIndex, hasHead); err != nil {
			return "", nil, err
		}
		addErr = addAll(ctx, ig, wtPath)
	}
	if addErr != nil && ctx.Err() != nil {
		return "", nil, addErr
	}
	// With --ignore-errors, a failed add still wrote the index with every
	// file it could read; record that rather than nothing.
	tree, err = ig.Run(ctx, wtPath, "write-tree")
	if err != nil {
		if addErr != nil {
			return "", nil, addErr
		}
		return "", nil, err
	}
	return tree, addErr, nil
}

func addAll(ctx context.Context, ig Git, wtPath string) error {
	_, err := ig.Run(ctx, wtPath, "add", "--all", "--ignore-errors")
	return err
}

func resetIndex(ctx context.Context, ig Git, wtPath, tmpIndex string, hasHead bool) error {
	if err := os.Remove(tmpIndex); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if !hasHead {
		return nil // an index that does not exist is empty
	}
	_, err := ig.Run(ctx, wtPath, "read-tree", "HEAD")
	return err
}

// recordCheckpoint applies Checkpoint's parent rule and moves ref, and
// returns the parents of the commit it made (nil when it made none: the
// checkpoint is HEAD or ref as it was). ident, when set, supplies the
// identity arguments (else they are looked up).
func recordCheckpoint(ctx context.Context, g Git, wtPath, ref, message, tree string, r refState, ident func() ([]string, error)) (sha string, made []string, err error) {
	wg := g.at(wtPath)
	head, prev := r.head, r.prev
	// Nothing new since the last checkpoint?
	if prev != "" && r.prevTree == tree {
		onHead := head == "" || prev == head || r.prevParent == head
		if !onHead {
			var err error
			if onHead, err = IsAncestor(ctx, g, wtPath, head, prev); err != nil {
				return "", nil, err
			}
		}
		if onHead {
			return prev, nil, nil
		}
	}
	var parents []string
	if head != "" {
		parents = append(parents, head)
	}
	if prev != "" && prev != head {
		keep := true
		if head != "" && r.prevParent != head { // a child of HEAD is not in it
			inHead, err := IsAncestor(ctx, g, wtPath, prev, head)
			if err != nil {
				return "", nil, err
			}
			keep = !inHead
		}
		if keep {
			parents = append(parents, prev)
		}
	}

	switch {
	case len(parents) == 0 && isEmptyTree(tree):
		return "", nil, nil // unborn and empty: nothing to record
	case len(parents) == 1 && parents[0] == head && r.headTree == tree:
		sha = head // clean worktree: the checkpoint is HEAD itself
	default:
		if ident == nil {
			ident = func() ([]string, error) { return g.identity(ctx, wtPath) }
		}
		id, err := ident()
		if err != nil {
			return "", nil, err
		}
		if strings.TrimSpace(message) == "" {
			message = "aq checkpoint"
		}
		args := append(append([]string(nil), id...), "commit-tree", "--no-gpg-sign", "-m", message)
		for _, p := range parents {
			args = append(args, "-p", p)
		}
		args = append(args, tree)
		if sha, err = wg.Run(ctx, wtPath, args...); err != nil {
			return "", nil, err
		}
		made = parents
	}
	if sha == prev {
		return sha, nil, nil
	}
	// Compare-and-swap: "" as the old value means "must not exist yet".
	if _, err := wg.Run(ctx, wtPath, "update-ref", "-m", "aq checkpoint", ref, sha, prev); err != nil {
		return "", nil, err
	}
	return sha, made, nil
}

// isEmptyTree reports whether tree is the empty tree (SHA-1 or SHA-256).
func isEmptyTree(tree string) bool {
	return tree == "4b825dc642cb6eb9a060e54bf8d69288fbee4904" ||
		tree == "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321"
}

// fullBranchRef turns "aq/wip/x" into "refs/heads/aq/wip/x"; full refs are
// kept.
func fullBranchRef(ref string) string {
	if strings.HasPrefix(ref, "refs/") {
		return ref
	}
	return "refs/heads/" + ref
}

// notRepo turns a git failure on dir into a *RepoError (ErrNotRepo), unless
// it was the context ending.
func notRepo(ctx context.Context, dir string, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return &RepoError{Dir: dir, Err: ErrNotRepo, Cause: err}
}

// copyFile copies src to dst and gives dst src's modification time.
func copyFile(src, dst string) (ok bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return false, err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return false, err
	}
	if err := out.Close(); err != nil {
		return false, err
	}
	if err := os.Chtimes(dst, fi.ModTime(), fi.ModTime()); err != nil {
		return false, err
	}
	return true, nil
}

// HeadBranch reads which branch the linked worktree at wtPath has checked
// out from its HEAD file, without a git: branch is the full ref HEAD
// names ("" when HEAD is detached). ok is false when the file does not
// say it plainly — not a linked worktree, not a regular file of at most
// 4 KiB (an engine can write there: never followed, never a FIFO), not
// "ref: <ref>" nor a commit hash, or the reftable backend's placeholder —
// and the caller asks git.
func HeadBranch(wtPath string) (branch string, ok bool) {
	admin, err := linkedGitDir(wtPath)
	if err != nil {
		return "", false
	}
	b, err := safefs.ReadFile("git directory", admin, "HEAD", 4096)
	if err != nil {
		return "", false
	}
	line, rest, _ := strings.Cut(string(b), "\n")
	if rest != "" {
		return "", false
	}
	if target, sym := strings.CutPrefix(line, "ref: "); sym {
		if !strings.HasPrefix(target, "refs/heads/") || target == "refs/heads/.invalid" || strings.ContainsAny(target, " \t\r") {
			return "", false
		}
		return target, true
	}
	if isFullSHA(line) {
		return "", true
	}
	return "", false
}
