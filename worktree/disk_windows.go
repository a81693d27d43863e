package worktree

import "io/fs"

// fileKey identifies a file; Windows reports no inode here, so each path
// counts.
type fileKey struct{ dev, ino uint64 }

// diskOf is fi's size (Windows: allocated blocks are not reported by Stat).
func diskOf(fi fs.FileInfo) (fileKey, int64) { return fileKey{}, fi.Size() }
