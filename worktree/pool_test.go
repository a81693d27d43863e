package worktree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// poolRepo is a repository for the pool tests: files in folders, a
// .gitignore, a submodule's gitlink (never populated) and three branches —
// main (where the previous job starts), next (main plus a change, a new file
// and a deletion: where the next job starts) and other (conflicts with
// main, for merges and rebases). It returns the repository and the sub
// repository the gitlink points into.
func poolRepo(t *testing.T) (repo, sub string) {
	t.Helper()
	root := t.TempDir()
	sub = testenv.NewRepo(t, root, "sub", map[string]string{"lib.txt": "lib\n"})
	subSHA := testenv.Git(t, sub, "rev-parse", "HEAD")
	repo = testenv.NewRepo(t, root, "repo", map[string]string{
		"README.md":      "# repo\n",
		"src/main.go":    "package main\n\nfunc main() {}\n",
		"src/old.go":     "package main\n// old\n",
		"docs/guide.md":  "guide\n",
		"docs/extra.md":  "extra\n",
		"tool.sh":        "#!/bin/sh\necho tool\n",
		".gitignore":     "*.log\nbuild/\n",
		".gitmodules":    "[submodule \"sub\"]\n\tpath = sub\n\turl = " + sub + "\n",
		"conflict.txt":   "base\n",
		"to-be-gone.txt": "bye\n",
	})
	testenv.Git(t, repo, "update-index", "--add", "--cacheinfo", "160000,"+subSHA+",sub")
	testenv.Git(t, repo, "commit", "-q", "-m", "submodule")
	testenv.Git(t, repo, "branch", "other")
	testenv.Git(t, repo, "branch", "next")
	// next: one change, one new file, one deletion.
	testenv.Git(t, repo, "checkout", "-q", "next")
	testenv.WriteFile(t, filepath.Join(repo, "src/main.go"), "package main\n\nfunc main() { println(1) }\n")
	testenv.WriteFile(t, filepath.Join(repo, "added.txt"), "added by next\n")
	testenv.Git(t, repo, "rm", "-q", "to-be-gone.txt")
	testenv.Git(t, repo, "add", "-A")
	testenv.Git(t, repo, "commit", "-q", "-m", "next")
	// other: conflicts with any change to conflict.txt.
	testenv.Git(t, repo, "checkout", "-q", "other")
	testenv.WriteFile(t, filepath.Join(repo, "conflict.txt"), "theirs\n")
	testenv.Git(t, repo, "commit", "-q", "-am", "other")
	testenv.Git(t, repo, "checkout", "-q", "main")
	return repo, sub
}

// view is everything a job sees of its worktree, as text: the files (type,
// mode, content), git status with ignored and untracked files, HEAD, the
// index (stage, mode, object, flags), the config with each entry's scope,
// per-worktree refs and state files, the shared stash, hooks and
// excludes, and the submodule's state. Two worktrees at the same path
// that a job cannot tell apart have the same view.
func view(t *testing.T, wt string) string {
	t.Helper()
	var b strings.Builder
	section := func(name, body string) { fmt.Fprintf(&b, "== %s\n%s\n", name, body) }
	var files []string
	err := filepath.WalkDir(wt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(wt, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", filepath.ToSlash(rel), info.Mode())
		switch {
		case rel == ".git":
			line += " (gitdir file)"
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case info.Mode().IsRegular():
			line += " " + fmt.Sprintf("%q", testenv.ReadFile(t, p))
		}
		files = append(files, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	section("files", strings.Join(files, "\n"))
	git := func(args ...string) string {
		out, err := testenv.GitErr(wt, args...)
		if err != nil {
			return "error: " + err.Error()
		}
		return out
	}
	section("status", git("status", "--porcelain=v1", "--ignored", "--untracked-files=all"))
	section("HEAD", git("symbolic-ref", "-q", "HEAD")+" "+git("rev-parse", "HEAD"))
	section("index", git("ls-files", "-s", "-v"))
	section("unmerged", git("ls-files", "-u"))
	section("config", git("config", "--list", "--show-scope"))
	section("worktree refs", git("for-each-ref", "--format=%(refname)", "refs/worktree", "refs/bisect", "refs/rewritten"))
	var state []string
	for _, name := range []string{"MERGE_HEAD", "MERGE_MSG", "CHERRY_PICK_HEAD", "REVERT_HEAD", "REBASE_HEAD", "BISECT_LOG", "BISECT_START",
		"rebase-merge", "rebase-apply", "sequencer", "info/sparse-checkout", "config.worktree", "modules", "index.lock", "FETCH_HEAD", "AUTO_MERGE"} {
		if testenv.Exists(gitPath(t, wt, name)) {
			state = append(state, name)
		}
	}
	section("per-worktree state", strings.Join(state, " "))
	section("split index", git("rev-parse", "--shared-index-path"))
	section("stash", git("stash", "list", "--format=%gs"))
	section("submodule", git("submodule", "status"))
	section("worktree list", worktreeLine(t, wt))
	var hooks []string
	if ents, err := os.ReadDir(gitPath(t, wt, "hooks")); err == nil {
		for _, e := range ents {
			hooks = append(hooks, e.Name())
		}
	}
	section("hooks", strings.Join(hooks, " "))
	if b, err := os.ReadFile(gitPath(t, wt, "info/exclude")); err == nil {
		section("info/exclude", string(b))
	}
	return b.String()
}

func gitPath(t *testing.T, wt, name string) string {
	t.Helper()
	p := testenv.Git(t, wt, "rev-parse", "--git-path", name)
	if !filepath.IsAbs(p) {
		p = filepath.Join(wt, p)
	}
	return p
}

// worktreeLine is wt's record in `git worktree list --porcelain`, less its
// HEAD (in the HEAD section).
func worktreeLine(t *testing.T, wt string) string {
	t.Helper()
	var recs []string
	for _, rec := range strings.Split(testenv.Git(t, wt, "worktree", "list", "--porcelain"), "\n\n") {
		lines := strings.Split(rec, "\n")
		if len(lines) == 0 || canon(strings.TrimPrefix(lines[0], "worktree ")) != canon(wt) {
			continue
		}
		recs = append(recs, strings.Join(slices.DeleteFunc(lines[1:], func(l string) bool { return strings.HasPrefix(l, "HEAD ") }), "; "))
	}
	return strings.Join(recs, " | ")
}

func canon(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// freshView is the view of a new worktree (`git worktree add -B branch path
// start`, by hand) at path: what a job would see without the pool. The
// worktree is removed again.
func freshView(t *testing.T, repo, path, branch, start string) string {
	t.Helper()
	testenv.Git(t, repo, "worktree", "add", "-q", "-B", branch, path, start)
	v := view(t, path)
	testenv.Git(t, repo, "worktree", "remove", "--force", path)
	return v
}

// diffViews is a line diff of two views, for failure messages.
func diffViews(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+ "+l)
		}
	}
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "- "+l)
		}
	}
	return strings.Join(out, "\n")
}

// testPool is the pool of repo in a temp folder beside it.
func testPool(t *testing.T, repo string) (Pool, string) {
	t.Helper()
	wts := filepath.Join(filepath.Dir(repo), "aqhome", "worktrees")
	return Pool{Dir: PoolDir(wts, "repo"), Size: 2}, wts
}

// sh runs a shell script in dir (for planting what a job leaves behind).
func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), testenv.Identity...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// TestPoolHandsNothingOn: whatever a job leaves in its worktree — files,
// index, per-worktree git state — the next job on the repository, given that
// worktree from the pool, sees exactly what a new `git worktree add` would
// show it.
func TestPoolHandsNothingOn(t *testing.T) {
	testenv.Slow(t, "hands many pooled worktrees on through every way they can be left dirty")
	scenarios := []struct {
		name  string
		plant string // run in the first job's worktree
	}{
		{"files", `
			echo new > untracked.txt; mkdir -p newdir/deep; echo x > newdir/deep/f
			echo log > debug.log; mkdir -p build/out; echo bin > build/out/app
			mkdir nested; (cd nested && git init -q && echo n > n && git add n && git commit -qm n)
			echo staged >> README.md; git add README.md
			echo fresh > staged-new.txt; git add staged-new.txt
			git rm -q docs/extra.md
			echo edited >> src/old.go
			rm docs/guide.md
			chmod +x src/main.go
			rm conflict.txt; mkdir conflict.txt; echo inside > conflict.txt/f
			echo "in the way" > added.txt
			ln -s README.md link
			rm tool.sh; ln -s /etc/passwd tool.sh
			git -c user.name=j -c user.email=j@x commit -qm "job commit" --allow-empty
			git checkout -q --detach HEAD`},
		{"index", `
			echo hidden >> README.md; git update-index --assume-unchanged README.md
			echo hidden2 >> src/old.go; git update-index --skip-worktree src/old.go
			echo ita > intent.txt; git add -N intent.txt
			git update-index --cacheinfo 160000,1111111111111111111111111111111111111111,sub
			rmdir sub
			git update-index --split-index
			git update-ref refs/worktree/mine HEAD; git update-ref refs/bisect/bad HEAD`},
		{"config-hooks-sparse", `
			printf '#!/bin/sh\nexit 0\n' > "$(git rev-parse --git-path hooks)/post-merge"
			git config extensions.worktreeConfig true
			git config --worktree core.hooksPath "$PWD/.myhooks"; mkdir .myhooks; printf '#!/bin/sh\nexit 1\n' > .myhooks/pre-commit
			git config --worktree user.name "previous job"
			git config --worktree core.fsmonitor false
			echo "*.secret" >> "$(git rev-parse --git-path info/exclude)"
			git sparse-checkout set docs`},
		{"merge", `
			echo ours > conflict.txt; git -c user.name=j -c user.email=j@x commit -qam ours
			git -c user.name=j -c user.email=j@x merge other >/dev/null 2>&1 || true
			test -f "$(git rev-parse --git-path MERGE_HEAD)"`},
		{"rebase", `
			echo ours > conflict.txt; git -c user.name=j -c user.email=j@x commit -qam ours
			git -c user.name=j -c user.email=j@x rebase other >/dev/null 2>&1 || true
			test -d "$(git rev-parse --git-path rebase-merge)"`},
		{"stash-bisect-cherry-pick", `
			echo stashed >> README.md; git -c user.name=j -c user.email=j@x stash push -q
			git bisect start HEAD HEAD~1 >/dev/null
			echo ours > conflict.txt; git -c user.name=j -c user.email=j@x commit -qam ours
			git -c user.name=j -c user.email=j@x cherry-pick other >/dev/null 2>&1 || true
			git fetch -q . other`},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ctx := ctxT(t)
			repo, _ := poolRepo(t)
			pool, wts := testPool(t, repo)
			first := filepath.Join(wts, "repo", "job-one")
			if res, err := pool.Checkout(ctx, Git{}, repo, first, "aq/job/job-one", "main"); err != nil || res.Reused {
				t.Fatalf("first job: %+v, %v", res, err)
			}
			sh(t, first, sc.plant)
			pooled, err := pool.Put(ctx, Git{}, repo, first)
			if err != nil || pooled == "" {
				t.Fatalf("put: %q, %v", pooled, err)
			}
			if testenv.Exists(first) {
				t.Fatalf("the first job's worktree is still at %s", first)
			}
			if out := testenv.Git(t, repo, "worktree", "list", "--porcelain"); !strings.Contains(out, "detached") || strings.Contains(out, "aq/job/job-one") {
				t.Errorf("a pooled worktree holds no branch:\n%s", out)
			}

			second := filepath.Join(wts, "repo", "job-two")
			next := testenv.Git(t, repo, "rev-parse", "next")
			res, err := pool.Checkout(ctx, Git{}, repo, second, "aq/job/job-two", next)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Reused || len(res.Discarded) > 0 {
				t.Fatalf("the pooled worktree was not reused: %+v", res)
			}
			got := view(t, second)
			testenv.Git(t, repo, "worktree", "remove", "--force", second)
			want := freshView(t, repo, second, "aq/job/job-two", next)
			if got != want {
				t.Errorf("the reused worktree differs from a new one:\n%s\n\nreused:\n%s", diffViews(want, got), got)
			}
			if testing.Verbose() {
				t.Logf("view:\n%s", got)
			}
		})
	}
}

// TestPoolTouchesOnlyWhatDiffers: taking a pooled worktree to a new base
// rewrites the files that differ and leaves the others' inodes and mtimes
// alone (git worked from the index's stat data).
func TestPoolTouchesOnlyWhatDiffers(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo, _ := poolRepo(t)
	pool, wts := testPool(t, repo)
	first := filepath.Join(wts, "repo", "a")
	if _, err := pool.Checkout(ctx, Git{}, repo, first, "aq/job/a", "main"); err != nil {
		t.Fatal(err)
	}
	before := inodes(t, first)
	if _, err := pool.Put(ctx, Git{}, repo, first); err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(wts, "repo", "b")
	res, err := pool.Checkout(ctx, Git{}, repo, second, "aq/job/b", "next")
	if err != nil || !res.Reused {
		t.Fatalf("%+v %v", res, err)
	}
	after := inodes(t, second)
	var rewritten []string
	for p, id := range after {
		if before[p] != id {
			rewritten = append(rewritten, p)
		}
	}
	slices.Sort(rewritten)
	// next changed src/main.go and added added.txt (to-be-gone.txt went).
	if want := []string{"added.txt", "src/main.go"}; !slices.Equal(rewritten, want) {
		t.Errorf("files written by the reset: %v, want %v", rewritten, want)
	}
	if _, ok := after["to-be-gone.txt"]; ok {
		t.Error("to-be-gone.txt is still there")
	}
}

// inodes maps each regular file under dir (but .git) to its inode and mtime.
func inodes(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || d.Name() == ".git" {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m[filepath.ToSlash(rel)] = fmt.Sprintf("%v %d", fileID(fi), fi.ModTime().UnixNano())
		return nil
	})
	return m
}

// TestPoolDiscardsWhatCannotBeMadeClean: a pooled worktree that cannot be
// reset — its index is locked, a file in it cannot be deleted, its .git file
// is broken — is discarded, and the job gets a new worktree that is, again,
// exactly a fresh one.
func TestPoolDiscardsWhatCannotBeMadeClean(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	cases := []struct {
		name    string
		breakIt func(t *testing.T, pooled string) (undo func())
		aside   bool // set aside rather than removed
	}{
		{name: "locked index", breakIt: func(t *testing.T, pooled string) func() {
			testenv.WriteFile(t, gitPath(t, pooled, "index.lock"), "")
			testenv.WriteFile(t, filepath.Join(pooled, "left-by-job.txt"), "x\n")
			return func() {}
		}},
		{name: "undeletable file", aside: true, breakIt: func(t *testing.T, pooled string) func() {
			p := filepath.Join(pooled, "build", "stuck.bin")
			testenv.WriteFile(t, p, "stuck\n")
			return makeUndeletable(t, p)
		}},
		{name: "broken .git file", breakIt: func(t *testing.T, pooled string) func() {
			testenv.WriteFile(t, filepath.Join(pooled, ".git"), "gitdir: /nonexistent\n")
			return func() {}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t)
			repo, _ := poolRepo(t)
			pool, wts := testPool(t, repo)
			first := filepath.Join(wts, "repo", "one")
			if _, err := pool.Checkout(ctx, Git{}, repo, first, "aq/job/one", "main"); err != nil {
				t.Fatal(err)
			}
			pooled, err := pool.Put(ctx, Git{}, repo, first)
			if err != nil {
				t.Fatal(err)
			}
			undo := c.breakIt(t, pooled)
			defer undo()

			second := filepath.Join(wts, "repo", "two")
			res, err := pool.Checkout(ctx, Git{}, repo, second, "aq/job/two", "next")
			if err != nil {
				t.Fatal(err)
			}
			if res.Reused || len(res.Discarded) == 0 {
				t.Fatalf("want a discarded pooled worktree and a new one: %+v", res)
			}
			var ue *UncleanError
			if !errors.As(res.Discarded[0], &ue) {
				t.Errorf("discarded because of %v, want an *UncleanError", res.Discarded[0])
			}
			t.Logf("discarded: %v", res.Discarded)
			if left, _ := pool.List(); len(left) != 0 {
				t.Errorf("pool still holds %v", left)
			}
			if got := len(pool.Discarded()); got != map[bool]int{false: 0, true: 1}[c.aside] {
				t.Errorf("%d worktrees set aside, want aside=%v", got, c.aside)
			}
			if n := strings.Count(testenv.Git(t, repo, "worktree", "list", "--porcelain"), "worktree "); n != 2 {
				t.Errorf("%d worktrees registered, want the repository's and the new one", n)
			}
			got := view(t, second)
			testenv.Git(t, repo, "worktree", "remove", "--force", second)
			if want := freshView(t, repo, second, "aq/job/two", "next"); got != want {
				t.Errorf("the new worktree differs from a fresh one:\n%s", diffViews(want, got))
			}
		})
	}
}

// TestPoolRefusesPopulatedSubmodule: git will not move a worktree with a
// populated submodule, so it never enters the pool: it stays where it is,
// and the next job gets a new worktree.
func TestPoolRefusesPopulatedSubmodule(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo, _ := poolRepo(t)
	pool, wts := testPool(t, repo)
	first := filepath.Join(wts, "repo", "one")
	if _, err := pool.Checkout(ctx, Git{}, repo, first, "aq/job/one", "main"); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, first, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init")
	testenv.Git(t, repo, "update-index", "--refresh") // (the main checkout is untouched)
	testenv.WriteFile(t, filepath.Join(first, "sub", "lib.txt"), "changed inside the submodule\n")
	pooled, err := pool.Put(ctx, Git{}, repo, first)
	if err == nil || pooled != "" {
		t.Fatalf("put: %q, %v; want git's refusal", pooled, err)
	}
	if !testenv.Exists(filepath.Join(first, "sub", "lib.txt")) {
		t.Fatal("the refused worktree was touched")
	}
	res, err := pool.Checkout(ctx, Git{}, repo, filepath.Join(wts, "repo", "two"), "aq/job/two", "next")
	if err != nil || res.Reused {
		t.Fatalf("%+v %v", res, err)
	}
}

// TestPoolSize: the pool keeps at most Size worktrees (Put says "" beyond),
// none with Size 0, and Take hands out the newest.
func TestPoolSize(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo, _ := poolRepo(t)
	pool, wts := testPool(t, repo)
	pool.Size = 1
	var made []string
	for _, id := range []string{"a", "b"} {
		p := filepath.Join(wts, "repo", id)
		if _, err := pool.Checkout(ctx, Git{}, repo, p, "aq/job/"+id, "main"); err != nil {
			t.Fatal(err)
		}
		made = append(made, p)
	}
	if got, err := pool.Put(ctx, Git{}, repo, made[0]); err != nil || got == "" {
		t.Fatalf("put a: %q %v", got, err)
	}
	if got, err := pool.Put(ctx, Git{}, repo, made[1]); err != nil || got != "" {
		t.Fatalf("put b into a full pool: %q %v", got, err)
	}
	if !testenv.Exists(made[1]) {
		t.Fatal("b was moved although the pool was full")
	}
	off := Pool{Dir: pool.Dir}
	if got, err := off.Put(ctx, Git{}, repo, made[1]); err != nil || got != "" {
		t.Fatalf("put with pooling off: %q %v", got, err)
	}
	if res, err := off.Checkout(ctx, Git{}, repo, filepath.Join(wts, "repo", "c"), "aq/job/c", "main"); err != nil || res.Reused {
		t.Fatalf("pooling off must not reuse: %+v %v", res, err)
	}
	if l, _ := pool.List(); len(l) != 1 {
		t.Fatalf("pool: %v", l)
	}
}

// TestPoolOnABloblessClone: on a blobless partial clone (aq's on-demand
// clones), a pooled worktree's reset fetches only the blobs of the files
// that differ between the two starting points, in one fetch, and a
// checkpoint fetches nothing.
func TestPoolOnABloblessClone(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	origin, _ := poolRepo(t)
	testenv.Git(t, origin, "config", "uploadpack.allowFilter", "true")
	testenv.Git(t, origin, "config", "uploadpack.allowAnySHA1InWant", "true")
	clone := filepath.Join(t.TempDir(), "repo")
	testenv.Git(t, "", "clone", "-q", "--filter=blob:none", "--no-checkout", "file://"+origin, clone)
	for _, b := range []string{"next", "other"} {
		testenv.Git(t, clone, "branch", b, "origin/"+b)
	}
	blobs := func() int {
		out := testenv.Git(t, clone, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype)")
		return strings.Count(out, "blob")
	}
	fetches := func() int {
		m, _ := filepath.Glob(filepath.Join(clone, ".git", "objects", "pack", "*.promisor"))
		return len(m)
	}
	if blobs() != 0 {
		t.Fatalf("the clone has %d blobs; want a blobless clone", blobs())
	}
	pool, wts := testPool(t, clone)
	first := filepath.Join(wts, "repo", "one")
	if _, err := pool.Checkout(ctx, Git{}, clone, first, "aq/job/one", "main"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Put(ctx, Git{}, clone, first); err != nil {
		t.Fatal(err)
	}
	b0, f0 := blobs(), fetches()
	second := filepath.Join(wts, "repo", "two")
	res, err := pool.Checkout(ctx, Git{}, clone, second, "aq/job/two", "next")
	if err != nil || !res.Reused {
		t.Fatalf("%+v %v", res, err)
	}
	// next changed src/main.go and added added.txt: two new blobs.
	if got := blobs() - b0; got != 2 {
		t.Errorf("the reset brought %d blobs, want the 2 that differ", got)
	}
	if got := fetches() - f0; got != 1 {
		t.Errorf("the reset fetched %d times, want once", got)
	}
	if testenv.ReadFile(t, filepath.Join(second, "added.txt")) != "added by next\n" {
		t.Error("added.txt was not checked out")
	}
	testenv.WriteFile(t, filepath.Join(second, "work.txt"), "w\n")
	b1, f1 := blobs(), fetches()
	if _, err := Checkpoint(ctx, Git{}, second, "aq/wip/two", "final"); err != nil {
		t.Fatal(err)
	}
	cp := &Checkpointer{Git: Git{}, Path: second, Watch: true, SmallIndex: -1}
	defer cp.Close()
	for range 2 {
		if _, err := cp.Checkpoint(ctx, "aq/wip/two", "periodic"); err != nil {
			t.Fatal(err)
		}
	}
	if fetches() != f1 || blobs() != b1+1 { // work.txt's blob, written locally
		t.Errorf("checkpoints fetched: %d fetches, %d blobs", fetches()-f1, blobs()-b1)
	}
}
