package worktree

import (
	"io/fs"
	"syscall"
)

// ctimeOf is fi's change time: unlike the modification time, a file's
// owner cannot set it back.
func ctimeOf(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ctimespec.Nano()
	}
	return 0
}
