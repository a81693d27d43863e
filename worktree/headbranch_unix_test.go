//go:build unix

package worktree

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/aqfleet/aq/internal/testenv"
)

// HeadBranch reads the branch a linked worktree's HEAD names from its
// file, and says it cannot when the file does not say it plainly: an
// engine may have put a link, a FIFO, a huge file or anything there.
func TestHeadBranch(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	wt := addWorktree(t, repo, "head", "main")
	admin := testenv.Git(t, wt, "rev-parse", "--absolute-git-dir")
	head := filepath.Join(admin, "HEAD")
	sha := testenv.Git(t, wt, "rev-parse", "HEAD")
	if b, ok := HeadBranch(wt); !ok || b != "refs/heads/aq/job/head" {
		t.Fatalf("HeadBranch = %q, %v; want refs/heads/aq/job/head", b, ok)
	}
	testenv.Git(t, wt, "checkout", "-q", "--detach")
	if b, ok := HeadBranch(wt); !ok || b != "" {
		t.Fatalf("detached: HeadBranch = %q, %v; want \"\", true", b, ok)
	}
	outside := filepath.Join(t.TempDir(), "HEAD")
	testenv.WriteFile(t, outside, "ref: refs/heads/main\n")
	for _, tc := range []struct {
		name  string
		plant func()
	}{
		{"reftable", func() { testenv.WriteFile(t, head, "ref: refs/heads/.invalid\n") }},
		{"not a branch", func() { testenv.WriteFile(t, head, "ref: refs/tags/v1\n") }},
		{"two lines", func() { testenv.WriteFile(t, head, "ref: refs/heads/main\nref: refs/heads/x\n") }},
		{"short hash", func() { testenv.WriteFile(t, head, sha[:12]+"\n") }},
		{"huge", func() { testenv.WriteFile(t, head, "ref: refs/heads/"+strings.Repeat("a", 8192)+"\n") }},
		{"link", func() { os.Remove(head); os.Symlink(outside, head) }},
		{"fifo", func() { os.Remove(head); unix.Mkfifo(head, 0o644) }},
		{"directory", func() { os.Remove(head); os.Mkdir(head, 0o755) }},
	} {
		tc.plant()
		if b, ok := HeadBranch(wt); ok {
			t.Errorf("%s: HeadBranch = %q, true; want not known", tc.name, b)
		}
		os.RemoveAll(head)
	}
}
