//go:build windows

package selftest

import (
	"context"

	"golang.org/x/sys/windows"
)

func freeBytes(dir string) (uint64, error) {
	p, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return 0, err
	}
	var free uint64
	if err := windows.GetDiskFreeSpaceEx(p, &free, nil, nil); err != nil {
		return 0, err
	}
	return free, nil
}

// checkLocksChild hands an flock to a child process; on Windows the repo lock
// is LockFileEx (gofrs/flock), whose handle a child does not inherit here.
func checkLocksChild(context.Context, *session) (string, error) {
	return "", skipf("a lock held by a child process is checked with flock(2), which Windows does not have (aq locks with LockFileEx there)")
}

// checkProcTagged: on Windows an engine's whole tree lives in its Job
// Object, so no process is looked for by tag.
func checkProcTagged(context.Context, *session) (string, error) {
	return "", skipf("Windows keeps an engine's processes in its Job Object; there is no sweep by tag")
}
