package worktree

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestDiskUsage counts the worktree's files and its git directory, and a
// file linked twice once.
func TestDiskUsage(t *testing.T) {
	repo := newRepo(t)
	wt := addWorktree(t, repo, "disk", "main")
	before, err := DiskUsage(wt)
	if err != nil || before <= 0 {
		t.Fatalf("DiskUsage: %d, %v", before, err)
	}
	big := filepath.Join(wt, "big.bin")
	testenv.WriteFile(t, big, strings.Repeat("x", 1<<20))
	after, _ := DiskUsage(wt)
	if after-before < 1<<20 {
		t.Errorf("a 1 MiB file added %d bytes", after-before)
	}
	if runtime.GOOS != "windows" {
		if err := os.Link(big, filepath.Join(wt, "big-again.bin")); err != nil {
			t.Fatal(err)
		}
		if again, _ := DiskUsage(wt); again-after > 4096 {
			t.Errorf("a hard link counted again: +%d bytes", again-after)
		}
	}
	// The git directory (its index) is in it.
	admin, err := linkedGitDir(wt)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(admin, "aq-extra"), strings.Repeat("y", 1<<20))
	if withAdmin, _ := DiskUsage(wt); withAdmin-after < 1<<20 {
		t.Errorf("the worktree's git directory is not counted")
	}
	if _, err := DiskUsage(filepath.Join(wt, "nope")); err == nil {
		t.Error("no error for a missing worktree")
	}
}
