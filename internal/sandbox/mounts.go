package sandbox

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The file view of a full sandbox (Linux), planned here as a list of mounts
// and made by the sandbox's init (mount_linux.go): the host's root bound
// read-only (nosuid, nodev), then, parents before children, the job's own
// directories bound read-write over what they replace (its home over
// $HOME, its temporary directory over /tmp and /var/tmp), empty read-only
// tmpfs over what is hidden, the worktree read-write at its own path, the
// job's git metadata and the toolchains bound back read-only where a hidden
// or replaced tree covers them, the caches as overlays, generated
// /etc/passwd and /etc/group — all after a minimal /dev and a fresh
// /proc, so that what lies below them lands on them. The plan is
// a pure function of the Policy and what exists on the host, so it is
// tested with tables (mounts_test.go).

// mountKind is what one mount does.
type mountKind string

const (
	mRoot    mountKind = "root"    // the host's / bound recursively, read-only, nosuid, nodev
	mHide    mountKind = "hide"    // an empty tmpfs, read-only once the mount points below it are made
	mBind    mountKind = "bind"    // host Src at Dst, read-only unless RW
	mFile    mountKind = "file"    // host file Src over the file Dst, read-only
	mOverlay mountKind = "overlay" // host Src read-only below the job's own Upper, at Dst
	mDev     mountKind = "dev"     // a minimal /dev
	mProc    mountKind = "proc"    // a fresh /proc of the sandbox's pid namespace
)

// mountOp is one mount of the plan. Dst is the path inside the sandbox.
type mountOp struct {
	Kind mountKind `json:"kind"`
	Src  string    `json:"src,omitempty"`
	Dst  string    `json:"dst"`
	RW   bool      `json:"rw,omitempty"`
	// Upper and Work are an overlay's writable layer and work directory
	// (the job's own).
	Upper string `json:"upper,omitempty"`
	Work  string `json:"work,omitempty"`
	// Optional: skip the mount, rather than fail the sandbox, when its
	// source is gone or its mount point cannot be made.
	Optional bool `json:"optional,omitempty"`
}

// replaces reports whether the op puts other content in place of the
// host's at Dst (so what the host has below Dst is not seen).
func (m mountOp) replaces() bool {
	switch m.Kind {
	case mHide, mBind, mOverlay, mDev, mProc:
		return true
	}
	return false
}

// pathInfo says whether a host path exists, whether it is a directory,
// and whether that directory is empty.
type pathInfo func(path string) (exists, dir, empty bool)

// view is what the plan gives the engine: its mounts, and the paths it
// may write inside the sandbox (for Landlock on top).
type view struct {
	Mounts []mountOp
	// Home is $HOME inside: the host's home path when the job's home is
	// seen there, else the job's home at its own path.
	Home     string
	Writable []string
}

// planMounts plans the file view of p. stat answers for host paths.
func planMounts(p Policy, stat pathInfo) view {
	p = p.Clean()
	var ops []mountOp
	v := view{Home: p.JobHome()}

	// What the job owns, in place of what the host has there.
	if h := p.Home; h != "" && h != "/" {
		if ok, dir, _ := stat(h); ok && dir {
			ops = append(ops, mountOp{Kind: mBind, Src: p.JobHome(), Dst: h, RW: true})
			v.Home = h
		}
	}
	if v.Home == p.JobHome() {
		ops = append(ops, mountOp{Kind: mBind, Src: p.JobHome(), Dst: p.JobHome(), RW: true})
	}
	for _, t := range []string{"/tmp", "/var/tmp"} {
		if ok, dir, _ := stat(t); ok && dir {
			ops = append(ops, mountOp{Kind: mBind, Src: p.JobTmp(), Dst: t, RW: true})
			v.Writable = append(v.Writable, t)
		}
	}
	for _, h := range p.Hidden {
		if ok, dir, _ := stat(h); ok && dir {
			ops = append(ops, mountOp{Kind: mHide, Dst: h})
		}
	}
	ops = append(ops,
		mountOp{Kind: mBind, Src: p.Worktree, Dst: p.Worktree, RW: true},
		mountOp{Kind: mBind, Src: p.StateDir(), Dst: p.StateDir(), RW: true})
	v.Writable = append(v.Writable, v.Home, p.Worktree, p.StateDir())
	for _, s := range p.Shared {
		if ok, dir, _ := stat(s); ok && dir {
			ops = append(ops, mountOp{Kind: mBind, Src: s, Dst: s, RW: true, Optional: true})
			v.Writable = append(v.Writable, s)
		}
	}
	for _, g := range p.GitDirs {
		ops = append(ops, mountOp{Kind: mBind, Src: g, Dst: g})
	}
	for _, r := range p.ReadOnly {
		if ok, _, _ := stat(r); ok {
			ops = append(ops, mountOp{Kind: mBind, Src: r, Dst: r, Optional: true})
		}
	}
	for i, c := range p.Caches {
		ok, dir, empty := stat(c)
		if !ok || !dir {
			continue
		}
		layer := filepath.Join(p.JobDir, "cache", strconv.Itoa(i))
		if empty {
			// Nothing to share: the job's own layer alone, without the
			// overlay's cost (a mount that probes the upper file system).
			ops = append(ops, mountOp{Kind: mBind, Src: filepath.Join(layer, "upper"), Dst: c, RW: true, Optional: true})
		} else {
			ops = append(ops, mountOp{Kind: mOverlay, Src: c, Dst: c, Upper: filepath.Join(layer, "upper"), Work: filepath.Join(layer, "work"), Optional: true})
		}
		v.Writable = append(v.Writable, c)
	}
	for _, f := range p.HiddenFiles {
		if ok, dir, _ := stat(f); ok && !dir {
			ops = append(ops, mountOp{Kind: mFile, Src: filepath.Join(p.JobDir, "etc", "empty"), Dst: f})
		}
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if ok, dir, _ := stat(f); ok && !dir {
			ops = append(ops, mountOp{Kind: mFile, Src: filepath.Join(p.JobDir, "etc", filepath.Base(f)), Dst: f})
		}
	}

	// Parents before children, so a child is mounted on what its parent
	// shows; for one path, what replaces the host's content first.
	slices.SortStableFunc(ops, func(a, b mountOp) int {
		if d := depth(a.Dst) - depth(b.Dst); d != 0 {
			return d
		}
		return rank(a) - rank(b)
	})

	// Drop what changes nothing: a hide or a read-only bind under a tree
	// that already replaces the host's content (the host's hidden files
	// are not there to hide, and the bind's content would be the host's
	// own, which the replacing tree is meant not to show — unless it is
	// bound back on purpose: ReadOnly and GitDirs are); a read-only bind
	// under no replaced tree (the host's root already shows it, read-only).
	// A fresh /dev and /proc first: what is bound below them (a worktree
	// under /dev/shm) must land on them, not under them.
	kept := []mountOp{{Kind: mDev, Dst: "/dev"}, {Kind: mProc, Dst: "/proc"}}
	for _, op := range ops {
		cover := coveringOp(kept, op.Dst)
		switch {
		case op.Kind == mHide && cover != nil:
			continue
		case op.Kind == mBind && !op.RW && cover == nil:
			continue
		case op.Kind == mBind && !op.RW && cover.Kind == mBind && !cover.RW && cover.Src == cover.Dst && op.Src == op.Dst:
			continue // within a read-only bind of its own host tree: shown already
		case op.Kind == mOverlay && cover == nil:
			// A cache outside the home: shown read-only by the root, and
			// still worth its writable layer.
		}
		kept = append(kept, op)
	}
	v.Mounts = append([]mountOp{{Kind: mRoot, Src: "/", Dst: "/"}}, kept...)
	v.Writable = append(v.Writable, "/dev/shm")
	return v
}

// coveringOp returns the deepest op of ops (all kept so far, parents
// first) whose Dst is path or a parent of it and that replaces the host's
// content there; nil when none does.
func coveringOp(ops []mountOp, path string) *mountOp {
	var best *mountOp
	for i := range ops {
		if ops[i].replaces() && within(path, ops[i].Dst) {
			if best == nil || depth(ops[i].Dst) >= depth(best.Dst) {
				best = &ops[i]
			}
		}
	}
	return best
}

// rank orders ops on the same path: what the job owns, then hides, then
// the rest.
func rank(op mountOp) int {
	switch {
	case op.Kind == mBind && op.RW:
		return 0
	case op.Kind == mHide:
		return 1
	}
	return 2
}

func depth(path string) int {
	if path == "/" {
		return 0
	}
	return strings.Count(path, "/")
}
