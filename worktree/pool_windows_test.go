package worktree

import (
	"io/fs"
	"testing"
)

func fileID(fs.FileInfo) uint64 { return 0 }

func chmodUndeletable(t *testing.T, p string) func() {
	t.Skip("no undeletable file on Windows in this test")
	return func() {}
}
