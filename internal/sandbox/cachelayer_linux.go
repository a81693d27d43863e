package sandbox

import (
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The caches' writable layers (JobDir/cache/<n>/upper and work) live, where
// aq may mount one, on a tmpfs of the job's own mounted at JobDir/cache in
// aq's mount namespace for as long as the run (#35 item 2;
// docs/sandbox.md, "Caches"). overlayfs probes its upper file system at
// every mount (a work directory, a whiteout, xattrs): on a loaded ext4
// that cost about 4 ms per cache per sandbox start, and removing the
// layers after the job tens of ms more; on tmpfs both are a fraction of a
// ms. One tmpfs for the whole run, not one per sandbox: the engine's
// sandbox and then verify's mount the same layers, so verify sees what
// the engine put in a cache (a module it downloaded, a package it
// installed), as it does with the layers on disk. Where aq cannot mount
// (it lacks CAP_SYS_ADMIN: a factory not run as root), the layers stay on
// disk, in the job's directory.

// cacheLayerName names the job's tmpfs in the mount table.
const cacheLayerName = "aq-cache-layers"

// cacheLayerSize is the tmpfs's bound: p.CacheLayerMax, else half the
// job's memory limit, else a quarter of the host's memory. The tmpfs's
// pages are charged to the memory cgroup of whatever writes them — the
// engine's or verify's run, whose memory limit they count against — so
// the bound keeps a runaway cache write a "no space left on device" of
// its own, well before an out-of-memory kill of the job.
func cacheLayerSize(p Policy) int64 {
	switch {
	case p.CacheLayerMax > 0:
		return p.CacheLayerMax
	case p.Limits.MemoryBytes > 0:
		return p.Limits.MemoryBytes / 2
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil && si.Totalram > 0 {
		return int64(si.Totalram) * int64(si.Unit) / 4
	}
	return 1 << 30
}

// mountCacheLayer mounts the job's tmpfs at dir (made and empty) with the
// bound size, owned by aq's user. It reports false, with nil, where aq may
// not mount (the layers then stay on disk), and an error for any other
// failure. A tmpfs that cannot hold the user xattrs overlayfs keeps in a
// user namespace (before Linux 6.6) is unmounted again: false.
func mountCacheLayer(dir string, size int64) (bool, error) {
	data := "mode=0700,uid=" + strconv.Itoa(unix.Getuid()) + ",gid=" + strconv.Itoa(unix.Getgid()) +
		",size=" + strconv.FormatInt(size, 10)
	if err := unix.Mount(cacheLayerName, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		if err == unix.EPERM || err == unix.EACCES {
			return false, nil
		}
		return false, fmt.Errorf("mount a tmpfs for the caches' layers at %s: %w", dir, err)
	}
	probe := filepath.Join(dir, ".xattr")
	fd, err := unix.Open(probe, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err == nil {
		err = unix.Fsetxattr(fd, "user.aq", []byte("1"), 0)
		_ = unix.Close(fd)
		_ = unix.Unlink(probe)
	}
	if err != nil {
		unmountCacheLayer(dir)
		return false, nil
	}
	return true, nil
}

// unmountCacheLayer lets go of the job's tmpfs at dir, if one is mounted
// there (a crashed run's too): its pages are freed with it. Nothing else
// is unmounted: only a tmpfs that is a mount point of its own at dir (a
// directory, not a link: its device differs from its parent's).
func unmountCacheLayer(dir string) {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR ||
		unix.Lstat(filepath.Dir(dir), &parent) != nil || st.Dev == parent.Dev {
		return
	}
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		return
	}
	_ = unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}
