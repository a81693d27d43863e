package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// makeRoot builds the file view v under root (an empty host directory that
// becomes the sandbox's /) in the calling process's mount namespace, which
// must be its own: the init runs it before pivot_root. Sources are host
// paths, still reachable at their own paths until the pivot.
func makeRoot(root string, v view) (notes []string, err error) {
	// Nothing of what follows may reach the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, &StartError{Step: "make mounts private", Err: err}
	}
	var hides []string
	for _, op := range v.Mounts {
		dst := filepath.Join(root, op.Dst)
		var err error
		switch op.Kind {
		case mRoot:
			err = bindRoot(root)
		case mHide:
			if err = ensureDir(dst); err == nil {
				err = unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m")
				hides = append(hides, dst)
			}
		case mBind:
			if op.RW && op.Optional {
				_ = os.MkdirAll(op.Src, 0o700) // a cache's layer of the job's own
			}
			err = bindOne(op.Src, dst, op.RW, true)
		case mFile:
			err = bindOne(op.Src, dst, false, false)
		case mOverlay:
			if oerr := overlay(op, dst); oerr != nil {
				// The cache of the job's own, empty: slower, never wrong.
				notes = append(notes, fmt.Sprintf("cache %s: no overlay (%v); the job gets an empty one of its own", op.Dst, oerr))
				err = bindOne(op.Upper, dst, true, true)
			}
		case mDev:
			err = makeDev(dst)
		case mProc:
			err = unix.Mount("proc", dst, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		default:
			err = fmt.Errorf("unknown mount kind %q", op.Kind)
		}
		if err != nil {
			if op.Optional {
				notes = append(notes, fmt.Sprintf("%s %s: skipped (%v)", op.Kind, op.Dst, err))
				continue
			}
			return notes, &StartError{Step: string(op.Kind) + " " + op.Dst, Err: err}
		}
	}
	// The hidden trees hold the mount points made in them; now they are
	// read-only.
	for _, h := range hides {
		if err := unix.Mount("", h, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
			return notes, &StartError{Step: "read-only " + strings.TrimPrefix(h, root), Err: err}
		}
	}
	return notes, nil
}

// bindRoot binds the host's / recursively at root and makes every mount of
// the copy read-only, nosuid and nodev (the host's own mounts are not
// touched: a bind is a mount of its own).
func bindRoot(root string) error {
	if err := unix.Mount("/", root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return unix.MountSetattr(unix.AT_FDCWD, root, unix.AT_RECURSIVE, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
	})
}

// bindOne binds src at dst (making the mount point, a directory or a file
// like src, where its parent lets it be made) and makes it read-only
// unless rw; recursive binds carry the mounts below src.
func bindOne(src, dst string, rw, rec bool) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if st.IsDir() {
		err = ensureDir(dst)
	} else {
		err = ensureFile(dst)
	}
	if err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND)
	if rec {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(src, dst, "", flags, ""); err != nil {
		return err
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if !rw {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	var at uint
	if rec {
		at = unix.AT_RECURSIVE
	}
	return unix.MountSetattr(unix.AT_FDCWD, dst, at, attr)
}

// overlay mounts op.Src read-only below the job's own writable layer.
func overlay(op mountOp, dst string) error {
	for _, p := range []string{op.Src, op.Upper, op.Work} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("%s: a path with ',' ':' or '\\' cannot be an overlay layer", p)
		}
	}
	for _, d := range []string{op.Upper, op.Work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	// volatile: the job's layer is thrown away with the job, so the kernel
	// need not sync it — without it, each overlay's unmount when the
	// sandbox ends syncs the upper file system (a journal commit each).
	// A volatile mount leaves work/incompat/volatile behind, which refuses
	// the next mount of the same layer (the job's verify after its
	// engine): overlayfs makes its work directory afresh anyway.
	if err := os.RemoveAll(filepath.Join(op.Work, "work")); err != nil {
		return err
	}
	if err := ensureDir(dst); err != nil {
		return err
	}
	data := "lowerdir=" + op.Src + ",upperdir=" + op.Upper + ",workdir=" + op.Work + ",userxattr,volatile"
	return unix.Mount("overlay", dst, "overlay", unix.MS_NOSUID|unix.MS_NODEV, data)
}

// devNodes are the host's device files the sandbox's /dev carries.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// makeDev mounts a minimal /dev at dst: the devNodes bound from the host,
// the usual links, a devpts of its own and a /dev/shm.
func makeDev(dst string) error {
	if err := ensureDir(dst); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	for _, n := range devNodes {
		p := filepath.Join(dst, n)
		if err := ensureFile(p); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+n, p, "", unix.MS_BIND, ""); err != nil {
			if n == "tty" { // no controlling terminal to speak of (a service)
				_ = os.Remove(p)
				continue
			}
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
	} {
		if err := os.Symlink(target, filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	pts := filepath.Join(dst, "pts")
	if err := ensureDir(pts); err != nil {
		return err
	}
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		_ = os.Remove(filepath.Join(dst, "ptmx")) // no terminals: fine for a headless engine
	}
	shm := filepath.Join(dst, "shm")
	if err := ensureDir(shm); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	return unix.MountSetattr(unix.AT_FDCWD, dst, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
}

// ensureDir makes dir (and its parents) where it does not exist.
func ensureDir(dir string) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	return os.MkdirAll(dir, 0o755)
}

// ensureFile makes an empty file at path (and its parent directories)
// where nothing exists.
func ensureFile(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// pivot makes root the process's / and lets go of the host's.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	return unix.Chdir("/")
}
