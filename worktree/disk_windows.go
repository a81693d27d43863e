package worktree

import (
	"io/fs"
	"os"
)

// fileKey identifies a file; Windows reports no inode here, so each path
// counts.
type fileKey struct{ dev, ino uint64 }

// diskOf is fi's size (Windows: allocated blocks are not reported by Stat).
func diskOf(fi fs.FileInfo) (fileKey, int64) { return fileKey{}, fi.Size() }

// fileStamp tells whether a file was rewritten: size and modification time.
type fileStamp struct {
	size, mtime int64
}

// stampFile is p's fileStamp (zero when p cannot be read).
func stampFile(p string) (fileStamp, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}, nil
}
