//go:build unix

package worktree

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// fileID is a file's inode number.
func fileID(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}

// chmodUndeletable makes p undeletable for a user that is not root: its
// folder loses write permission. It returns the undo.
func chmodUndeletable(t *testing.T, p string) func() {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Skip("root deletes files in read-only folders, and this platform has no immutable flag here")
	}
	dir := filepath.Dir(p)
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	undo := func() { os.Chmod(dir, 0o755) }
	t.Cleanup(undo)
	return undo
}
