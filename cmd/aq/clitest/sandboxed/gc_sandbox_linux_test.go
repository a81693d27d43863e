package sandboxed

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/gc"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestGCSandboxDirAfterKill9 (#23): aq is killed -9 while its engine runs
// in the job's sandbox, which leaves the job's sandbox directory behind
// ($AQ_HOME/sandbox/<id>: the engine's home, here with a file standing for
// a copy of its login). aq gc keeps it while the job waits for its
// recovery; `aq status` recovers the job (it leaves the directory); the
// next aq gc removes it, and a third deletes nothing.
func TestGCSandboxDirAfterKill9(t *testing.T) {
	clitest.FullHost(t)
	t.Parallel() // its own home and job ids
	h := clitest.BinHome(t)
	h.Env = append(h.Env, "AQ_SANDBOX=on")
	h.Repo(t, "app", nil)
	name := "gc-sandbox"
	id := testenv.ID(name)
	// The worktree is the one place both the sandboxed engine and the test
	// see: it says there that it runs, after leaving a "login" in its home.
	h.Submit(t, name, clitest.ScriptJob("app", `echo secret > "$HOME/.login-copy"
touch ready
while :; do sleep 0.05; done`, "ship: none"))
	aq := clitest.Start(t, h, "run", "--once")
	ready := filepath.Join(h.Dir, "worktrees", "app", id, "ready")
	sbDir := filepath.Join(h.Dir, "sandbox", id)
	deadline := time.Now().Add(2 * time.Minute)
	for !testenv.Exists(ready) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine never said it runs; aq: %s", aq.Wait())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !testenv.Exists(filepath.Join(sbDir, "home", ".login-copy")) {
		t.Fatalf("the job's sandbox directory has no home with the engine's file: %v", testenv.Exists(sbDir))
	}

	// While the job runs, gc keeps it.
	if rep := gcJSON(t, h); rep.Deleted.Sandboxes != 0 || rep.Kept.Sandboxes != 1 || !testenv.Exists(sbDir) {
		t.Fatalf("gc while the job runs: deleted %d, kept %d", rep.Deleted.Sandboxes, rep.Kept.Sandboxes)
	}

	if err := syscall.Kill(aq.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := aq.Wait(); r.Code != -1 {
		t.Fatalf("aq was not killed: %s", r)
	}
	deadline = time.Now().Add(30 * time.Second)
	for pids, _ := process.FindTagged(id); len(pids) > 0; pids, _ = process.FindTagged(id) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine outlived its aq: %v", pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := show(t, h, name); v.Stage != job.Building {
		t.Fatalf("after kill -9 the job is in %s, want building", v.Stage)
	}
	if !testenv.Exists(sbDir) {
		t.Fatal("the kill -9 left no sandbox directory: nothing for gc to do")
	}

	// Not yet recovered: kept.
	if rep := gcJSON(t, h); rep.Deleted.Sandboxes != 0 || rep.Kept.Sandboxes != 1 || !testenv.Exists(sbDir) {
		t.Fatalf("gc before the recovery: deleted %d, kept %d, exists %v", rep.Deleted.Sandboxes, rep.Kept.Sandboxes, testenv.Exists(sbDir))
	}

	if b := board(t, h); len(b.Recovered) != 1 || b.Recovered[0] != id {
		t.Fatalf("status recovered %v, want [%s]", b.Recovered, id)
	}
	if v := show(t, h, name); v.Stage != job.Inbox || v.Reason != job.ReasonCrash {
		t.Fatalf("after recovery: %s %s", v.Stage, v.Reason)
	}
	if !testenv.Exists(sbDir) {
		t.Fatal("the recovery removed the directory itself: gc's part is not shown")
	}

	// Recovered: removed, secret and all.
	if rep := gcJSON(t, h); rep.Deleted.Sandboxes != 1 || testenv.Exists(sbDir) {
		t.Fatalf("gc after the recovery: deleted %d, exists %v", rep.Deleted.Sandboxes, testenv.Exists(sbDir))
	}
	if rep := gcJSON(t, h); rep.Deleted.Total() != 0 || rep.Kept.Sandboxes != 0 {
		t.Fatalf("gc again: deleted %+v, kept %+v", rep.Deleted, rep.Kept)
	}
	if _, err := os.Stat(filepath.Join(h.Dir, "sandbox")); err != nil {
		t.Fatalf("the sandbox folder itself went: %v", err)
	}
}

// gcJSON is `aq gc --json --offline`, decoded.
func gcJSON(t *testing.T, h *testenv.Home) gc.Report {
	t.Helper()
	r := h.Run(t, "gc", "--json", "--offline")
	var rep gc.Report
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &rep) != nil {
		t.Fatalf("aq gc --json: %s", r)
	}
	return rep
}
