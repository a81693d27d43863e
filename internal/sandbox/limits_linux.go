package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// One limits interface, two backends (docs/sandbox.md, "Limits"): a run's
// memory and process count are held by a cgroup v2 of its own where the
// host delegates one to aq (cgroup_linux.go), else by a memory and a pids
// cgroup v1 where aq may write those hierarchies (cgroup1_linux.go: root on
// a cgroup v1 host). Either way every process the run starts is inside
// before the engine starts, the end tells an out-of-memory kill apart,
// what is left is killed and the cgroups are removed.

// limiter makes the limits of one run on this host.
type limiter interface {
	make(j *Jail) runLimits
	// describe names the backend ("cgroup v2", "cgroup v1") and where
	// job cgroups are made.
	describe() (how, where string)
}

// runLimits are one run's limits.
type runLimits interface {
	// failed is the error of limits that could not be set up: the run must
	// not start without the limits it was given.
	failed() error
	// fd is the directory fd to start the run in (clone3's
	// CLONE_INTO_CGROUP), -1 for none.
	fd() int
	// enterThread puts the calling thread (locked to its goroutine, and
	// ending with it) in the limits, so what it forks starts inside.
	enterThread() error
	// place puts a started process in the limits (the sandbox's init,
	// before it is given its orders).
	place(pid int) error
	// started lets go of what starting needed.
	started()
	// close reports whether the kernel killed for memory, kills what is
	// left and removes the limits.
	close() (oom bool, err error)
}

// limits are the limits of one run of j: none when the host has no
// limiter or j no limit to hold.
func (p hostPlatform) limits(j *Jail) runLimits {
	if p.cgroup == nil || j.p.Limits == (Limits{}) {
		return noLimits{}
	}
	return p.cgroup.make(j)
}

// findLimiter finds the cgroup backend aq can hold limits with: v2 where
// delegated, else v1; it changes nothing. why says why there is none.
func findLimiter() (l limiter, why string) {
	v2, why2 := findCgroup()
	if v2 != nil {
		return v2, ""
	}
	v1, why1 := findCgroupV1()
	if v1 != nil {
		return v1, ""
	}
	return nil, why2 + "; " + why1
}

type noLimits struct{}

func (noLimits) failed() error                { return nil }
func (noLimits) fd() int                      { return -1 }
func (noLimits) enterThread() error           { return nil }
func (noLimits) place(int) error              { return nil }
func (noLimits) started()                     {}
func (noLimits) close() (oom bool, err error) { return false, nil }

// HostMemory is the host's memory in bytes (0 unknown): what the default
// memory limit of a job is a share of.
func HostMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// RemoveStaleCgroups removes the job cgroups a crashed aq left (aq killed
// -9 before its runs' ends): those named for an aq process that is no
// longer alive, in the cgroups this host's limits are held in; what is
// still in one is killed first. It returns what it removed.
func RemoveStaleCgroups(alive func(pid int) bool) ([]string, error) {
	l, _ := findLimiter()
	if l == nil {
		return nil, nil
	}
	var parents []string
	switch c := l.(type) {
	case *cgroupParent:
		parents = []string{c.dir}
	case *cgroupV1:
		parents = []string{c.memory, c.pids}
	}
	return removeStaleCgroups(parents, alive)
}

func removeStaleCgroups(parents []string, alive func(pid int) bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, p := range parents {
		ents, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			rest, ok := strings.CutPrefix(e.Name(), jobCgroupPrefix)
			if !ok || !e.IsDir() {
				continue
			}
			pidS, _, _ := strings.Cut(rest, "-")
			pid, err := strconv.Atoi(pidS)
			if err != nil || pid <= 0 || alive(pid) {
				continue
			}
			dir := filepath.Join(p, e.Name())
			if err := killRemoveV1(dir, unix.Rmdir); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}
