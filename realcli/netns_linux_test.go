package realcli_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// netns is an OS thread in a network namespace of the test's own, with only
// loopback up: a listener opened and a process started on it live in that
// namespace (the child inherits the thread's), so an engine run with
// AQ_SANDBOX=off reaches the fake on 127.0.0.1 and nothing else. The thread
// is never unlocked: it ends with its goroutine, namespace and all.
type netns struct {
	work chan func()
}

func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("an unsandboxed real-CLI run needs a network namespace of its own (CLONE_NEWNET), which needs root here")
	}
	ns := &netns{work: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for f := range ns.work {
			f()
		}
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(ns.work) })
	return ns
}

// do runs f on the namespace's thread.
func (ns *netns) do(f func()) {
	done := make(chan struct{})
	ns.work <- func() { defer close(done); f() }
	<-done
}

// loopbackUp sets lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo up: %w", err)
	}
	return nil
}
