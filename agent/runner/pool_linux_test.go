package runner_test

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestWorktreeWithAProcessInItIsNotPooled: a process that escaped the job's
// tag but still has its working directory in the worktree keeps the
// worktree out of the pool: the next job must not share files with it.
func TestWorktreeWithAProcessInItIsNotPooled(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	out := f.run(context.Background(), f.job("linger", `env -u AQ_JOB_ID -u AQ_SCOPE setsid sh -c 'echo $$ > "$MARK/pid"; exec sleep 120' >/dev/null 2>&1 &
while [ ! -s "$MARK/pid" ]; do sleep 0.01; done
echo x > x.txt
`), runner.Options{})
	pid := readPid(t, f.marker("pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if out.Failed() || out.Pooled {
		t.Fatalf("want success, not pooled: %+v", out)
	}
	if !process.Alive(pid) {
		t.Fatal("the untagged process died: the test proves nothing")
	}
	if !testenv.Exists(filepath.Join(f.wt("linger"), "x.txt")) {
		t.Error("the worktree was not left where it ran")
	}
}
