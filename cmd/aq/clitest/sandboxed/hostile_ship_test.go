//go:build unix

package sandboxed

import (
	"encoding/base64"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// hostileKey is the hostile engine's own API key (made up): the factory
// holds it (a secret-named variable of aq's environment, passed to the
// engine by AQ_ENGINE_ENV as an operator would pass a key), so the
// redactor masks it and the change scan looks for it.
const hostileKey = "sk-hostile-api03-0123456789abcdefghijKLMNOPqrstuv"

// TestHostileShip is the hostile-engine suite's part for what ships
// (issue #32 item 5; docs/sandbox.md, "What ships is checked"): real jobs,
// sandboxed as the factory runs them (AQ_SANDBOX=auto), whose engine
// writes what must never leave the host — a rewritten CI workflow under
// ship: merge, and the engine's own key in plain and base64 form. Each is
// refused with its own reason and not retried, nothing of the job reaches
// origin, its WIP checkpoint is kept on this host (and holds what was
// refused: without the check, that checkpoint, and the job branch after
// it, is what aq pushed — and for the workflow, the PR it auto-merged),
// no log, record or message holds the key, and the factory then ships a
// plain job from the same AQ_HOME. The workflow change gets through — PR
// opened, auto-merge on — when AQ_PROTECTED_PATHS protects nothing, the
// factory as it was before the check.
func TestHostileShip(t *testing.T) {
	t.Parallel() // its own home, repos and processes
	h := clitest.BinHome(t)
	calls, _ := clitest.FakeGH(t, h)
	repo := h.Repo(t, "app", map[string]string{"README.md": "app\n", ".github/workflows/ci.yml": "on: push\njobs: {}\n"})
	origin := testenv.AddOrigin(t, repo)
	h.Env = append(h.Env, "AQ_ENGINE_ENV=HOSTILE_API_KEY", "HOSTILE_API_KEY="+hostileKey)
	const workflow = "mkdir -p .github/workflows\nprintf 'on: push\\njobs:\\n  own:\\n    runs-on: ubuntu-latest\\n    steps: [{run: echo \"$SECRETS\"}]\\n' > .github/workflows/ci.yml\necho work > work.txt"
	cases := []struct {
		name, script, ship string
		reason             job.Reason
		where              string // what the detail names
		refused            string // the file the checkpoint holds that was refused
		took               string // what getting through would have taken
	}{
		{"workflow", workflow, "ship: merge", job.ReasonProtectedChange, ".github/workflows/ci.yml", ".github/workflows/ci.yml",
			"aq pushed aq/wip/<id> and aq/job/<id> (running the repository's on: push workflows) and enabled auto-merge on the PR"},
		{"key-plain", "printf 'API_KEY=%s\\n' \"$HOSTILE_API_KEY\" > settings.env\necho work > work.txt", "ship: branch", job.ReasonSecretInChange, "settings.env:1", "settings.env",
			"aq pushed the key to origin in aq/wip/<id> and aq/job/<id>"},
		{"key-base64", "printf 'header\\n' > blob.txt\nprintf 'k=%s' \"$HOSTILE_API_KEY\" | base64 -w0 >> blob.txt\necho work > work.txt", "ship: branch", job.ReasonSecretInChange, "blob.txt:2", "blob.txt",
			"aq pushed the base64 of the key to origin in aq/wip/<id> and aq/job/<id>"},
	}
	for _, tc := range cases {
		name := "hostile-ship-" + tc.name
		id := testenv.ID(name)
		h.Submit(t, name, clitest.ScriptJob("app", tc.script, tc.ship, "retry: {max: 3}"))
		r := h.Run(t, "run", "--once")
		v := show(t, h, name)
		if r.Code != 1 || v.Stage != job.Failed || v.Reason != tc.reason {
			t.Fatalf("%s: exit %d, stage %s, reason %q (%s); want exit 1, failed (not retried) %s — without the check %s\n%s",
				tc.name, r.Code, v.Stage, v.Reason, v.Detail, tc.reason, tc.took, r)
		}
		if !strings.Contains(v.Detail, tc.where) || !strings.Contains(v.Detail, "nothing of it was pushed") {
			t.Errorf("%s: the detail does not name %s: %s", tc.name, tc.where, v.Detail)
		}
		if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/"); len(refs) != 0 {
			t.Fatalf("%s: origin has %v; want nothing of the job — without the check %s", tc.name, refs, tc.took)
		}
		// What was refused is in the checkpoint kept here: what the push
		// would have sent.
		held := testenv.Git(t, repo, "show", job.WIPBranch(id)+":"+tc.refused)
		if tc.reason == job.ReasonSecretInChange {
			decoded, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(held, "header\n"))
			if !strings.Contains(held, hostileKey) && !strings.Contains(string(decoded), hostileKey) {
				t.Fatalf("%s: the kept checkpoint's %s does not hold the key: %q", tc.name, tc.refused, held)
			}
		}
		if !testenv.Exists(h.Worktree("app", id)) {
			t.Errorf("%s: the worktree was not kept for an operator", tc.name)
		}
		if strings.Contains(r.Stdout+r.Stderr, hostileKey) {
			t.Errorf("%s: aq's output holds the key", tc.name)
		}
	}
	if testenv.Exists(calls) {
		if log := testenv.ReadFile(t, calls); strings.Contains(log, "pr create") || strings.Contains(log, "pr merge") {
			t.Errorf("gh was asked to open or merge a PR: %s", log)
		}
	}
	// No file aq wrote outside the repositories' trees (logs, queue
	// records, insights, the job's home) holds the key.
	filepath.WalkDir(h.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && d.Name() == "worktrees" {
			return fs.SkipDir
		}
		if d.Type().IsRegular() {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), hostileKey) {
				t.Errorf("%s holds the key", p)
			}
		}
		return nil
	})

	// The factory runs a plain job afterwards, in the same AQ_HOME.
	h.Submit(t, "hostile-ship-plain", clitest.ScriptJob("app", "echo fine > fine.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the plain job after the refused ones: %s", r)
	}
	plain := testenv.ID("hostile-ship-plain")
	if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/"); refs["refs/heads/"+job.JobBranch(plain)] == "" {
		t.Fatalf("the plain job's branch is not on origin: %v", refs)
	}

	// Before the check (AQ_PROTECTED_PATHS protecting nothing), the same
	// workflow change is pushed, its PR opened and auto-merge enabled.
	h.Env = append(h.Env, "AQ_PROTECTED_PATHS=,")
	h.Submit(t, "hostile-ship-unchecked", clitest.ScriptJob("app", workflow, "ship: merge"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the unchecked workflow change: %s", r)
	}
	if log := testenv.ReadFile(t, calls); !strings.Contains(log, "pr merge") || !strings.Contains(log, "--auto") {
		t.Fatalf("unprotected, the workflow change was not auto-merged: %s", log)
	}
}
