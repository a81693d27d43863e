//go:build unix

package selftest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/worktree"
)

func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil
}

func checkLocksChild(ctx context.Context, s *session) (string, error) {
	dir, err := os.MkdirTemp("", "aq-selftest-locks-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "child.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return "", failf("flock: %v", err)
	}
	sleep := s.h.lookPath("sleep")
	if sleep == "" {
		f.Close()
		return "", skipf("no sleep binary on PATH to hold the lock")
	}
	tag := "st-" + s.h.token + "-lockchild"
	cmd := exec.Command(sleep, "30")
	cmd.Env = append(secrets.EngineEnv(s.h.env), process.TagEnv+"="+tag)
	cmd.ExtraFiles = []*os.File{f} // the child shares the lock's open file description
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return "", err
	}
	f.Close() // from now on only the child holds the lock
	pid := cmd.Process.Pid
	waited := false
	defer func() {
		if !waited {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}()
	held, err := worktree.Held(dir, "child")
	if err != nil || !held {
		return "", failf("a lock held by child process %d does not read as held (%v)", pid, err)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = cmd.Wait()
	waited = true
	// Another process this one forks at the same moment holds a copy of
	// the lock's file until its exec closes it: allow for that.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	werr := fixture.WaitFor(wctx, "the lock to be free", func() bool {
		held, err = worktree.Held(dir, "child")
		return err != nil || !held
	})
	cancel()
	if err != nil || werr != nil {
		return "", failf("the lock of a child killed -9 is still held (%v): a dead aq would block its repo", errors.Join(err, werr))
	}
	return fmt.Sprintf("a lock held by child process %d reads as held, and is free once it is killed -9", pid), nil
}

func checkProcTagged(ctx context.Context, s *session) (string, error) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		return "", skipf("finding processes by tag needs /proc/<pid>/environ (Linux) or sysctl kern.procargs2 (macOS); on %s escaped engine processes are not swept", runtime.GOOS)
	}
	sleep := s.h.lookPath("sleep")
	if sleep == "" {
		return "", skipf("no sleep binary on PATH")
	}
	tag, scope := "st-"+s.h.token+"-proctag", "aq-selftest-"+s.h.token
	cmd := exec.Command(sleep, "30")
	cmd.Env = append(secrets.EngineEnv(s.h.env), process.TagEnv+"="+tag, process.ScopeEnv+"="+scope)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	}()
	// A process in the middle of its exec shows an empty environment for a
	// moment: look until the child is sleep.
	var pids []int
	var err error
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_ = fixture.WaitFor(wctx, "the tagged process", func() bool {
		pids, err = process.FindScoped(tag, scope)
		return err != nil || len(pids) > 0
	})
	cancel()
	if err != nil {
		return "", failf("cannot look for tagged processes: %v (is /proc mounted with hidepid?)", err)
	}
	if len(pids) != 1 || pids[0] != pid {
		return "", failf("looked for process %d by its tag and found %v: escaped engine processes would survive their job (is /proc mounted with hidepid?)", pid, pids)
	}
	n, err := process.KillScoped(ctx, tag, scope, 200*time.Millisecond)
	if err != nil || n != 1 {
		return "", failf("killing by tag: %d killed, %v", n, err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return "", failf("the tagged process outlived KillScoped")
	}
	return fmt.Sprintf("process %d found by its job tag in /proc and killed by it", pid), nil
}
