package gc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

// helperEnv makes the re-executed test binary hold a lock instead of
// running tests: the "other process" of the in-flight cases.
const helperEnv = "AQ_GC_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "hold-lock" {
		os.Exit(holdLock())
	}
	os.Exit(testenv.Main(m))
}

// holdLock takes the lock AQ_LOCK_NAME (a repo or job lock name) in
// AQ_LOCKS_DIR, says "locked", and holds it until stdin closes.
func holdLock() int {
	dir, name := os.Getenv("AQ_LOCKS_DIR"), os.Getenv("AQ_LOCK_NAME")
	var (
		l   *worktree.Lock
		err error
	)
	if id, ok := strings.CutPrefix(name, "jobs/"); ok {
		l, err = worktree.LockJob(context.Background(), dir, id)
	} else {
		l, err = worktree.LockRepo(context.Background(), dir, name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin)
	l.Unlock()
	return 0
}

// holdInOtherProcess starts a process that holds lock name until the test
// ends, and returns its pid.
func holdInOtherProcess(t *testing.T, locksDir, name string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=hold-lock", "AQ_LOCKS_DIR="+locksDir, "AQ_LOCK_NAME="+name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "locked" {
		t.Fatalf("lock holder said %q, %v", line, err)
	}
	return cmd.Process.Pid
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// factory is one host's layout: AQ_HOME, AQ_REPO_BASE, and bare origins.
type factory struct {
	t        testing.TB
	home     string
	repoBase string
	origins  string
}

func newFactory(t testing.TB) *factory {
	root := t.TempDir()
	f := &factory{t: t, home: filepath.Join(root, "aqhome"), repoBase: filepath.Join(root, "src"), origins: filepath.Join(root, "origins")}
	for _, d := range []string{f.home, f.repoBase, f.origins} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *factory) locksDir() string     { return filepath.Join(f.home, "locks") }
func (f *factory) worktreesDir() string { return filepath.Join(f.home, "worktrees") }
func (f *factory) repoDir(name string) string {
	return filepath.Join(f.repoBase, name)
}
func (f *factory) originDir(name string) string { return filepath.Join(f.origins, name+".git") }
func (f *factory) wtPath(repo, id string) string {
	return filepath.Join(f.worktreesDir(), repo, id)
}

// newRepo makes repo under AQ_REPO_BASE on main with a bare origin.
func (f *factory) newRepo(name string) string {
	t := f.t
	dir := testenv.NewRepo(t, f.repoBase, name, map[string]string{
		"README.md":  "# " + name + "\n",
		"src/app.go": "package app\n\nfunc A() int { return 1 }\n",
		".gitignore": "*.log\n",
	})
	testenv.Git(t, "", "init", "-q", "--bare", "-b", "main", f.originDir(name))
	testenv.Git(t, dir, "remote", "add", "origin", f.originDir(name))
	testenv.Git(t, dir, "push", "-q", "origin", "main")
	testenv.Git(t, dir, "fetch", "-q", "origin")
	return dir
}

// onOrigin runs fn in a fresh clone of repo's origin (GitHub's side: merges
// happen there), then pushes main back.
func (f *factory) onOrigin(repo string, fn func(clone string)) {
	t := f.t
	clone := filepath.Join(t.TempDir(), "clone")
	testenv.Git(t, "", "clone", "-q", f.originDir(repo), clone)
	fn(clone)
	testenv.Git(t, clone, "push", "-q", "origin", "main")
}

// runJob does what the runner does for one job, its commits dated at: a
// worktree on aq/job/<id> from base, the engine's edits, a checkpoint to
// aq/wip/<id>, and (when commit) the result squashed onto base on the job
// branch. It returns the worktree.
func (f *factory) runJob(repo, id string, at time.Time, edits map[string]string, commit bool) string {
	t := f.t
	ctx := ctxT(t)
	dir := f.repoDir(repo)
	wt := f.wtPath(repo, id)
	date := at.Format(time.RFC3339)
	g := worktree.Git{Env: []string{"GIT_AUTHOR_DATE=" + date, "GIT_COMMITTER_DATE=" + date}}
	if err := worktree.Add(ctx, g, dir, wt, "aq/job/"+id, "main"); err != nil {
		t.Fatal(err)
	}
	base := testenv.Git(t, wt, "rev-parse", "HEAD")
	for p, c := range edits {
		testenv.WriteFile(t, filepath.Join(wt, p), c)
	}
	if _, err := worktree.Checkpoint(ctx, g, wt, "refs/heads/aq/wip/"+id, "aq checkpoint: "+id); err != nil {
		t.Fatal(err)
	}
	if commit {
		if _, _, err := worktree.SquashOnto(ctx, g, wt, base, "job "+id); err != nil {
			t.Fatal(err)
		}
	}
	return wt
}

// push pushes refs (branch names) of repo to origin.
func (f *factory) push(repo string, branches ...string) {
	args := []string{"push", "-q", "origin"}
	for _, b := range branches {
		args = append(args, "+refs/heads/"+b+":refs/heads/"+b)
	}
	testenv.Git(f.t, f.repoDir(repo), args...)
}

func (f *factory) gc(mods ...func(*GC)) *GC {
	g := &GC{
		Cfg: Config{
			RepoBase:     f.repoBase,
			WorktreesDir: f.worktreesDir(),
			LocksDir:     f.locksDir(),
			Policy:       plan.Policy{WIPRetention: 14 * 24 * time.Hour},
		},
		Now: time.Now,
	}
	for _, m := range mods {
		m(g)
	}
	return g
}
