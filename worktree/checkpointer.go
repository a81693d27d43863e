package worktree

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Checkpointer takes the repeated checkpoints of one worktree while its
// engine runs (the periodic checkpoints), at a cost that follows what
// changed rather than the size of the worktree. Each call records the same
// thing Checkpoint would — every tracked change, deletion and untracked file,
// not ignored ones, on ref, with Checkpoint's parent rule, never taking the
// worktree's index.lock — with these differences in how:
//
//   - It keeps its own index (the checkpoint index, in the worktree's git
//     directory under aq-checkpoint/), a copy of the worktree's index that
//     it updates with what changed since the last checkpoint, so git's stat
//     cache is refreshed once and stays right (a copy thrown away after
//     each checkpoint, as Checkpoint uses, is stale or "racily clean" again
//     every time, and git re-reads those files). It is copied afresh from
//     the worktree's index whenever that changes (the engine staged,
//     committed or refreshed it) or a .gitignore changed, so the result is
//     exactly Checkpoint's.
//   - It finds what changed with `git status` on that index with git's
//     untracked cache, instead of `git add --all`'s walk of every folder,
//     and adds only those paths (`git update-index`).
//   - On Linux it also watches the worktree (inotify) from the first call
//     on, and answers git's fsmonitor hook (core.fsmonitor, protocol 2) with
//     the paths changed since the last checkpoint, so git does not even stat
//     the rest. When nothing changed — no event, the worktree's index, HEAD
//     and the ref as they were — it returns the last checkpoint without
//     running git beyond one read of HEAD and the ref.
//
// Anything unexpected (git refuses the checkpoint index, a file cannot be
// read) falls back to Checkpoint's own way for that call, with its partial
// result. A write through a shared memory mapping may escape the watcher
// until the file is closed: take the checkpoint that matters (after the
// engine) with Checkpoint.
//
// A Checkpointer is for one worktree at one path; its methods may be called
// from several goroutines. Close stops the watcher.
type Checkpointer struct {
	Git  Git
	Path string
	// Watch turns on the inotify watcher (Linux; elsewhere it is quietly
	// not used).
	Watch bool
	// SmallIndex: below this size of the worktree's index (0: 1 MiB, about
	// 8,000 files; negative: never) a checkpoint that is not "nothing
	// changed" is one scan, Checkpoint's, which then costs less than the
	// checkpoint index's three git runs.
	SmallIndex int64

	mu        sync.Mutex
	admin     string // the worktree's git directory
	seed      fileStamp
	seeded    bool
	cpTree    string // tree of the checkpoint index ("" = unknown)
	ident     []string
	identOK   bool
	mon       *monitor
	monErr    error
	tokenSeq  uint64 // the monitor's seq the checkpoint index's fsmonitor token stands for
	tokenOK   bool
	freshSeed bool // the checkpoint index is the worktree's, nothing added yet
	// last is the last checkpoint: HEAD and the worktree's index then, the
	// result, and the watcher's seq at its start.
	last struct {
		head, sha string
		stamp     fileStamp
	}
	lastSeq uint64
	// Stats counts how the calls went, for tests and benchmarks.
	Stats CheckpointStats
}

// CheckpointStats counts a Checkpointer's calls by how they went.
type CheckpointStats struct {
	Calls     int // checkpoints taken
	Unchanged int // answered from the watcher: nothing changed
	Small     int // a small worktree: one scan (Checkpoint)
	Seeded    int // the checkpoint index was copied from the worktree's
	Fallback  int // done the way Checkpoint does it
	Watched   int // git was told what changed (fsmonitor answer)
}

// Checkpoint records the worktree on ref; see the type's doc.
func (c *Checkpointer) Checkpoint(ctx context.Context, ref, message string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Stats.Calls++
	ref = fullBranchRef(ref)
	_, _ = RemoveSpecialFiles(c.Path) // a FIFO .gitignore would hang git status (special.go)
	wg := c.Git.at(c.Path)
	if c.admin == "" {
		admin, err := linkedGitDir(c.Path)
		if err != nil {
			// Not a linked worktree (a main checkout): the plain way.
			c.Stats.Fallback++
			return Checkpoint(ctx, c.Git, c.Path, ref, message)
		}
		c.admin = admin
	}
	r, err := resolveRefs(ctx, wg, c.Path, ref)
	if err != nil {
		return "", err
	}
	cpDir := filepath.Join(c.admin, "aq-checkpoint")
	cpIndex := filepath.Join(cpDir, "index")
	if c.Watch && c.mon == nil && c.monErr == nil {
		c.mon, c.monErr = startMonitor(c.Path, filepath.Join(cpDir, "cookies"))
	}
	fallback := func() (string, error) {
		c.Stats.Fallback++
		c.seeded = false // start from the worktree's index next time
		sha, err := Checkpoint(ctx, c.Git, c.Path, ref, message)
		c.last.sha = "" // no shortcut next time
		return sha, err
	}

	stamp, _ := stampFile(filepath.Join(c.admin, "index"))

	// Nothing changed since the last checkpoint — no event in the
	// worktree, its index, HEAD and the ref as they were — and the ref
	// still holds it: no git beyond reading HEAD and the ref.
	var seq uint64
	watched := false
	if c.mon != nil {
		if s, err := c.mon.sync(ctx); err == nil {
			seq, watched = s, true
			if paths, ok := c.mon.since(c.lastSeq); ok && len(paths) == 0 && c.last.sha != "" && c.last.sha == r.prev &&
				r.head == c.last.head && stamp == c.last.stamp {
				c.lastSeq = seq
				c.Stats.Unchanged++
				return r.prev, nil
			}
		}
	}
	record := func(sha string, err error) (string, error) {
		if err == nil || errors.As(err, new(*PartialError)) {
			c.last.head, c.last.sha, c.last.stamp, c.lastSeq = r.head, sha, stamp, seq
			if sha == "" {
				c.last.sha = r.prev
			}
			if !watched {
				c.last.sha = "" // no watcher: no shortcut next time
			}
		}
		return sha, err
	}
	// A small worktree is quickest done in one scan: the checkpoint index's
	// extra git runs cost more than they save.
	small := c.SmallIndex
	if small == 0 {
		small = defaultSmallIndex
	}
	if fi, err := os.Stat(filepath.Join(c.admin, "index")); err != nil || fi.Size() < small {
		c.Stats.Small++
		sha, _, _, err := checkpointScan(ctx, c.Git, c.Path, filepath.Join(c.admin, "index"), ref, message, r)
		return record(sha, err)
	}

	if !c.seeded || stamp != c.seed || !fileExists(cpIndex) {
		if err := c.reseed(cpIndex, stamp); err != nil {
			return fallback()
		}
	}
	// What the watcher saw change since the checkpoint index's token.
	q := query{cpDir: cpDir, watched: watched, seq: seq}
	if watched {
		q.paths, q.known = c.mon.since(c.tokenSeq)
		q.known = q.known && c.tokenOK
	}

	changed, err := c.status(ctx, wg, cpIndex, q)
	if err == nil && hasGitignore(changed) && !c.freshSeed {
		// What counts as ignored may have changed, and the checkpoint index
		// holds files earlier checkpoints added: start again from the
		// worktree's index.
		if err = c.reseed(cpIndex, stamp); err == nil {
			q.known = false
			changed, err = c.status(ctx, wg, cpIndex, q)
		}
	}
	if err != nil {
		return fallback()
	}
	ig := wg.with("GIT_INDEX_FILE=" + cpIndex)
	if len(changed) > 0 {
		var in bytes.Buffer
		for _, p := range changed {
			in.WriteString(strings.TrimSuffix(p, "/"))
			in.WriteByte(0)
		}
		args := append(q.args(), "update-index", "--add", "--remove", "--replace", "-z", "--stdin")
		if _, err := ig.runStdin(ctx, c.Path, bytes.NewReader(in.Bytes()), args...); err != nil {
			// A file git cannot read, a nested repository without a
			// commit: Checkpoint's way records the rest.
			return fallback()
		}
		c.cpTree, c.freshSeed = "", false
	}
	tree := c.cpTree
	if tree == "" {
		if tree, err = ig.Run(ctx, c.Path, append(q.args(), "write-tree")...); err != nil {
			return fallback()
		}
		c.cpTree = tree
	}
	sha, _, err := recordCheckpoint(ctx, c.Git, c.Path, ref, message, tree, r, c.identity(ctx))
	return record(sha, err)
}

// defaultSmallIndex is Checkpointer.SmallIndex's default.
const defaultSmallIndex = 1 << 20

// query is what git is told about changes for one checkpoint: with
// watched, the fsmonitor hook answers with paths (known) or "everything".
type query struct {
	cpDir   string
	watched bool
	seq     uint64
	paths   []string
	known   bool
}

// args are the configuration every git run on the checkpoint index gets,
// so that each keeps the index's untracked cache and fsmonitor token.
func (q query) args() []string {
	args := []string{"-c", "core.untrackedCache=true", "-c", "status.showUntrackedFiles=all"}
	if !q.watched {
		return append(args, "-c", "core.fsmonitor=false")
	}
	// git runs the hook through the shell with the protocol version and
	// its token appended; the answer, written for the token this index
	// holds, ignores them.
	return append(args, "-c", "core.fsmonitor=f() { exec cat "+shellQuote(q.hook())+"; }; f", "-c", "core.fsmonitorHookVersion=2")
}

func (q query) hook() string { return filepath.Join(q.cpDir, "fsmonitor-answer") }

// reseed copies the worktree's index to the checkpoint index (keeping its
// modification time: git's racy-entry check compares against it).
func (c *Checkpointer) reseed(cpIndex string, stamp fileStamp) error {
	if err := os.MkdirAll(filepath.Dir(cpIndex), 0o700); err != nil {
		return err
	}
	tmp := cpIndex + ".new"
	_ = os.Remove(tmp)
	if _, err := copyFile(filepath.Join(c.admin, "index"), tmp); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		_ = os.Remove(cpIndex) // no index yet: an empty one
	} else if err := os.Rename(tmp, cpIndex); err != nil {
		return err
	}
	c.seed, c.seeded, c.freshSeed = stamp, true, true
	c.cpTree, c.tokenOK = "", false
	c.Stats.Seeded++
	return nil
}

// status runs `git status` on the checkpoint index and returns the paths
// whose worktree side differs from it: modified, deleted, type-changed,
// unmerged and untracked (nested repositories as "dir/").
func (c *Checkpointer) status(ctx context.Context, wg Git, cpIndex string, q query) ([]string, error) {
	if q.watched {
		if err := writeAtomic(q.hook(), fsmonitorAnswer(q.seq, q.paths, q.known)); err != nil {
			return nil, err
		}
		c.Stats.Watched++
	}
	args := append(q.args(), "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules=dirty")
	before, _ := stampFile(cpIndex)
	out, err := wg.with("GIT_INDEX_FILE="+cpIndex).run(ctx, c.Path, nil, args)
	if err != nil {
		return nil, err
	}
	// git writes the index, with the token it was just given, only when
	// it has something to save; otherwise the index keeps its older token,
	// whose answer next time is a superset.
	if after, _ := stampFile(cpIndex); q.watched && after != before {
		c.tokenSeq, c.tokenOK = q.seq, true
	}
	return parseStatusZ(out), nil
}

// parseStatusZ picks the paths with a change on the worktree side out of
// `git status --porcelain=v1 -z --no-renames`.
func parseStatusZ(out []byte) []string {
	var paths []string
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) < 4 || rec[2] != ' ' {
			continue
		}
		x, y := rec[0], rec[1]
		if (x == '?' && y == '?') || (y != ' ' && y != '!') || x == 'U' || y == 'U' || (x == 'D' && y == 'D') || (x == 'A' && y == 'A') {
			paths = append(paths, string(rec[3:]))
		}
	}
	return paths
}

func hasGitignore(paths []string) bool {
	for _, p := range paths {
		if path.Base(strings.TrimSuffix(p, "/")) == ".gitignore" {
			return true
		}
	}
	return false
}

// fsmonitorAnswer is the fsmonitor hook's output (protocol 2): a token,
// then the changed paths, each NUL-terminated; "/" says "everything".
func fsmonitorAnswer(seq uint64, paths []string, known bool) []byte {
	var b bytes.Buffer
	b.WriteString("aq:" + strconv.FormatUint(seq, 10))
	b.WriteByte(0)
	if !known {
		b.WriteString("/")
		b.WriteByte(0)
		return b.Bytes()
	}
	for _, p := range paths {
		b.WriteString(p)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// identity is the commit identity arguments, looked up once.
func (c *Checkpointer) identity(ctx context.Context) func() ([]string, error) {
	return func() ([]string, error) {
		if c.identOK {
			return c.ident, nil
		}
		id, err := c.Git.identity(ctx, c.Path)
		if err != nil {
			return nil, err
		}
		c.ident, c.identOK = id, true
		return id, nil
	}
}

// Close stops the watcher. The checkpoint index stays (in the worktree's
// git directory, it goes with the worktree or its next reset).
func (c *Checkpointer) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mon != nil {
		c.mon.close()
		c.mon = nil
	}
	c.monErr = errors.New("closed")
}

// writeAtomic writes b to p through a temporary file and a rename.
func writeAtomic(p string, b []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
