package local_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestSandboxRequiredWaits: a job whose manifest says sandbox: required is
// not taken by a host whose engines run unsandboxed (AQ_SANDBOX=off): it
// waits in the inbox, and Runnable says why — the capability and what
// this host has instead. A host at the full level offers sandbox:full and
// takes it.
func TestSandboxRequiredWaits(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	agent := func(mode sandbox.Mode) *local.Agent {
		cfg := &config.Config{Home: h.Dir, RepoBase: h.RepoBase, KillGrace: 200 * time.Millisecond, Poll: time.Second,
			Supervisor: exe, Sandbox: mode}
		a, err := local.New(cfg, testLogger(t), secrets.FromEnviron(), local.Parts{})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	off := agent(sandbox.ModeOff)
	submit(t, off, "needs-sandbox", "repo: app\nengine: script\nscript: \"echo x > x.txt\"\nship: none\nsandbox: required")
	if _, err := off.RunOne(context.Background()); !errors.Is(err, queue.ErrNoJob) {
		t.Fatalf("AQ_SANDBOX=off took the job: %v", err)
	}
	host, err := off.HostCaps(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ok, why := local.Runnable(host, state(t, off, "needs-sandbox"))
	if want := "missing capability: sandbox:full (AQ_SANDBOX=off: engines run unsandboxed here)"; ok || why != want {
		t.Errorf("Runnable: %v %q, want %q", ok, why, want)
	}
	if st := state(t, off, "needs-sandbox"); st.Stage != job.Inbox || st.Attempts != 0 {
		t.Fatalf("the job moved: %+v", st)
	}

	on := agent(sandbox.ModeAuto)
	if lvl := on.Runner.Sandbox.Level(); lvl != sandbox.LevelFull {
		t.Skipf("this host sandboxes at level %s: %s", lvl, on.Runner.Sandbox.Report().MissingLine())
	}
	host, err = on.HostCaps(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tokens := strings.Join(host.Tokens(), " "); !strings.Contains(tokens, "sandbox:full sandbox:partial") {
		t.Errorf("a full host's offer: %s", tokens)
	}
	res, err := on.RunOne(context.Background())
	if err != nil || res.JobID != testenv.ID("needs-sandbox") || res.Outcome.Failed() {
		t.Fatalf("the sandboxing host: %+v, %v", res, err)
	}
}
