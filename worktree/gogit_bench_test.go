package worktree

// go-git beside the git CLI for what gc reads most: listing the aq/ refs with
// their tips' times, and which of them are merged into base. These
// benchmarks are the measurement behind the package doc's choice
// (docs/BENCHMARKS.md, "go-git for gc").

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/aqfleet/aq/internal/testenv"
)

// gcBenchRepo is a repository with a main of `history` commits and `refs`
// aq/job/* branches, half merged (pointing into main's history), half not
// (one commit on an old main commit), packed as a long-lived clone is.
func gcBenchRepo(b *testing.B, history, refs int) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "repo")
	testenv.Git(b, "", "init", "-q", "-b", "main", dir)
	// fast-import writes the history in one process.
	var in strings.Builder
	for i := 1; i <= history; i++ {
		content := fmt.Sprintf("v%d\n", i)
		fmt.Fprintf(&in, "commit refs/heads/main\nmark :%d\ncommitter a <a@b> %d +0000\ndata 2\nc\n", i, 1700000000+i)
		if i > 1 {
			fmt.Fprintf(&in, "from :%d\n", i-1)
		}
		fmt.Fprintf(&in, "M 644 inline f%d.txt\ndata %d\n%s\n", i%50, len(content), content)
	}
	for r := 0; r < refs; r++ {
		at := 1 + (r*7919)%history
		if r%2 == 0 {
			fmt.Fprintf(&in, "reset refs/heads/aq/job/m%d\nfrom :%d\n\n", r, at)
			continue
		}
		content := fmt.Sprintf("job %d\n", r)
		fmt.Fprintf(&in, "commit refs/heads/aq/job/u%d\ncommitter a <a@b> %d +0000\ndata 2\nj\nfrom :%d\nM 644 inline job%d.txt\ndata %d\n%s\n", r, 1800000000+r, at, r, len(content), content)
	}
	testenvGitStdin(b, dir, in.String(), "fast-import", "--quiet")
	testenv.Git(b, dir, "gc", "-q")
	return dir
}

func testenvGitStdin(b *testing.B, dir, stdin string, args ...string) string {
	b.Helper()
	out, err := Git{}.runStdin(context.Background(), dir, strings.NewReader(stdin), args...)
	if err != nil {
		b.Fatal(err)
	}
	return string(out)
}

// BenchmarkGCRefsGitVsGoGit: for 200 aq/ refs over a 2,000-commit main,
// list (refs and tip times) and merged (which tips are in main), each with
// one git process or with go-git (the repository opened once per op, as gc
// does per repository per run; ancestry as one walk of main's history and a
// set lookup per ref, go-git's quickest way).
func BenchmarkGCRefsGitVsGoGit(b *testing.B) {
	ctx := context.Background()
	dir := gcBenchRepo(b, 2000, 200)
	b.Run("list/git", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			refs, err := ListRefInfo(ctx, Git{}, dir, "refs/heads/aq/")
			if err != nil || len(refs) != 200 {
				b.Fatalf("%d refs, %v", len(refs), err)
			}
		}
	})
	b.Run("list/go-git", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if n := goGitList(b, dir); n != 200 {
				b.Fatalf("%d refs", n)
			}
		}
	})
	b.Run("merged/git", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			m, err := MergedInto(ctx, Git{}, dir, "main", "refs/heads/aq/")
			if err != nil || len(m) != 100 {
				b.Fatalf("%d merged, %v", len(m), err)
			}
		}
	})
	b.Run("merged/go-git", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if n := goGitMerged(b, dir); n != 100 {
				b.Fatalf("%d merged", n)
			}
		}
	})
}

func goGitList(b *testing.B, dir string) int {
	repo, err := gogit.PlainOpen(dir)
	if err != nil {
		b.Fatal(err)
	}
	iter, err := repo.References()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	err = iter.ForEach(func(r *plumbing.Reference) error {
		if !strings.HasPrefix(r.Name().String(), "refs/heads/aq/") || r.Type() != plumbing.HashReference {
			return nil
		}
		c, err := repo.CommitObject(r.Hash())
		if err != nil {
			return err
		}
		_ = c.Committer.When
		n++
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func goGitMerged(b *testing.B, dir string) int {
	repo, err := gogit.PlainOpen(dir)
	if err != nil {
		b.Fatal(err)
	}
	main, err := repo.Reference("refs/heads/main", true)
	if err != nil {
		b.Fatal(err)
	}
	head, err := repo.CommitObject(main.Hash())
	if err != nil {
		b.Fatal(err)
	}
	inMain := map[plumbing.Hash]bool{}
	err = object.NewCommitPreorderIter(head, nil, nil).ForEach(func(c *object.Commit) error {
		inMain[c.Hash] = true
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	iter, err := repo.References()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	_ = iter.ForEach(func(r *plumbing.Reference) error {
		if strings.HasPrefix(r.Name().String(), "refs/heads/aq/") && inMain[r.Hash()] {
			n++
		}
		return nil
	})
	return n
}

// TestGoGitRefusesWhatJobsDo: go-git (v5) will not open a repository once a
// job in any of its worktrees ran `git sparse-checkout set` (which sets
// extensions.worktreeConfig), while git reads it fine: a gc built on go-git
// would stop cleaning that repository. If a go-git release learns the
// extension, this test fails: revisit the package doc then.
func TestGoGitRefusesWhatJobsDo(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	repo := newRepo(t)
	if _, err := gogit.PlainOpen(repo); err != nil {
		t.Fatalf("go-git cannot open a plain repository: %v", err)
	}
	wt := addWorktree(t, repo, "sparse", "main")
	testenv.Git(t, wt, "sparse-checkout", "set", "src")
	t.Logf("config: %s", testenv.Git(t, repo, "config", "--local", "--list"))
	if _, err := ListRefInfo(ctxT(t), Git{}, repo, "refs/heads/"); err != nil {
		t.Fatalf("git: %v", err)
	}
	_, err := gogit.PlainOpen(repo)
	t.Logf("go-git: %v", err)
	if err == nil {
		t.Error("go-git now opens a repository with extensions.worktreeConfig: the package doc's reason no longer holds")
	}
}
