//go:build unix

package runner

import (
	"io/fs"
	"syscall"
)

// freeSpace is what an unprivileged user may still write on path's file
// system.
func freeSpace(path string) (int64, bool) {
	var st syscall.Statfs_t
	if syscall.Statfs(path, &st) != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}

// allocatedOf is a file's allocated bytes (st_blocks), and for a file with
// more than one link its (device, inode), to count it once.
func allocatedOf(info fs.FileInfo) (blocks int64, key [2]uint64, linked bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return info.Size(), key, false
	}
	if st.Nlink > 1 && !info.IsDir() {
		key, linked = [2]uint64{uint64(st.Dev), uint64(st.Ino)}, true
	}
	return int64(st.Blocks) * 512, key, linked
}
