//go:build unix

package worktree

import (
	"io/fs"
	"syscall"
)

// fileKey identifies an inode.
type fileKey struct{ dev, ino uint64 }

// diskOf is fi's inode and the bytes of its allocated blocks.
func diskOf(fi fs.FileInfo) (fileKey, int64) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{}, fi.Size()
	}
	return fileKey{uint64(st.Dev), uint64(st.Ino)}, int64(st.Blocks) * 512
}
