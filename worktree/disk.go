package worktree

import (
	"io/fs"
	"path/filepath"
)

// DiskUsage is the disk a worktree takes: the blocks of every file and
// folder under path, and of its own git directory (its index, aq's
// checkpoint index), each inode counted once. Files that vanish during the
// walk are skipped; an error is returned only when path itself cannot be
// read.
func DiskUsage(path string) (int64, error) {
	seen := map[fileKey]bool{}
	var total int64
	walk := func(root string) error {
		return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root {
					return err
				}
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			k, size := diskOf(fi)
			if k != (fileKey{}) {
				if seen[k] {
					return nil
				}
				seen[k] = true
			}
			total += size
			return nil
		})
	}
	if err := walk(path); err != nil {
		return 0, err
	}
	if admin, err := linkedGitDir(path); err == nil {
		_ = walk(admin)
	}
	return total, nil
}
