package worktree

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// makeUndeletable makes the file p impossible to delete: as root, with the
// immutable flag (chattr +i; tmpfs and ext4 have it), else by taking write
// permission from its folder. The undo runs at cleanup too, so that the
// test's temp folder can go.
func makeUndeletable(t *testing.T, p string) func() {
	t.Helper()
	if os.Geteuid() != 0 {
		return chmodUndeletable(t, p)
	}
	set := func(p string, on bool) error {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
		if err != nil {
			return err
		}
		if on {
			flags |= fsImmutableFL
		} else {
			flags &^= fsImmutableFL
		}
		return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags))
	}
	if err := set(p, true); err != nil {
		t.Skipf("cannot make %s immutable on this file system: %v", p, err)
	}
	// The file may have moved since (set aside): clear every file under
	// the test's temp folder, the file's top.
	root := p
	for filepath.Dir(root) != os.TempDir() && filepath.Dir(root) != root {
		root = filepath.Dir(root)
	}
	undo := func() {
		filepath.WalkDir(root, func(q string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				_ = set(q, false)
			}
			return nil
		})
	}
	t.Cleanup(undo)
	return undo
}

// fsImmutableFL is FS_IMMUTABLE_FL from linux/fs.h (x/sys/unix lacks it).
const fsImmutableFL = 0x00000010
