//go:build unix

package worktree

import (
	"io/fs"
	"os"
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

// fileStamp tells whether a file was rewritten: its inode (git writes an
// index to a new file and renames it into place), size and modification
// time.
type fileStamp struct {
	key         fileKey
	size, mtime int64
}

// stampFile is p's fileStamp (zero when p cannot be read).
func stampFile(p string) (fileStamp, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return fileStamp{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}, nil
	}
	return fileStamp{key: fileKey{uint64(st.Dev), uint64(st.Ino)}, size: fi.Size(), mtime: fi.ModTime().UnixNano()}, nil
}
