//go:build !unit

package jobs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestUndoAMistakeLocal is the newcomer's typo, undone: a misspelt repo
// dead-letters at once; submitting the fixed manifest again is refused
// (the id exists), `aq submit --replace` gives the job the fixed manifest
// and it ships, its history kept. --replace of a running job, and aq job rm
// of a running or unknown job, change nothing: one line, exit 2 (the same
// line aq job show gives for an unknown id). aq job rm removes a finished
// job and names the jobs that wait for it.
func TestUndoAMistakeLocal(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "webapp", nil)
	dir := t.TempDir()
	id := testenv.ID("norepo")
	file := filepath.Join(dir, "norepo.md")
	write := func(repo string) {
		testenv.WriteFile(t, file, "---\nid: "+id+"\n"+clitest.ScriptJob(repo, "echo hello > hello.txt")+"---\n# Say hello\n")
	}
	write("webap")
	if r := h.Run(t, "submit", file); r.Code != 0 || !strings.Contains(r.Stderr, "did you mean repo: webapp?") {
		t.Fatalf("submit of the typo: %s", r)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 1 || !strings.Contains(r.Stderr, "repo_unavailable") {
		t.Fatalf("the typo's run: %s", r)
	}
	write("webapp")
	if r := h.Run(t, "submit", file); r.Code != 2 || !strings.Contains(r.Stderr, "already exists (in dead_letter) (`aq submit --replace` gives it this manifest") {
		t.Fatalf("submitting the fix again: %s", r)
	}
	before := show(t, h, "norepo")
	r := h.Run(t, "submit", "--replace", file)
	if r.Code != 0 || r.Stdout != "replaced "+id+" (it was in dead_letter): now in inbox\n" {
		t.Fatalf("submit --replace: %s", r)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 0 || !strings.Contains(r.Stdout, "job "+id+": shipped") {
		t.Fatalf("the fixed job's run: %s", r)
	}
	after := show(t, h, "norepo")
	if after.Stage != job.Shipped || after.Repo != "webapp" || after.Attempts != 2 || len(after.History) != len(before.History)+3 {
		t.Fatalf("after the fix: %s repo %s attempts %d, %d history entries (was %d)", after.Stage, after.Repo, after.Attempts, len(after.History), len(before.History))
	}
	if b, _ := os.ReadFile(after.Manifest); !strings.Contains(string(b), "repo: webapp") {
		t.Errorf("the stored manifest is not the new one:\n%s", b)
	}

	// A running job is neither replaced nor removed.
	long := testenv.ID("long")
	h.Submit(t, "long", clitest.ScriptJob("webapp", "touch \"$MARK/started\"\nwhile [ ! -e \"$MARK/go\" ]; do sleep 0.02; done"))
	aq := clitest.Start(t, h, "run", "--once")
	aq.WaitMark(mark, "started")
	longFile := filepath.Join(dir, "long.md")
	testenv.WriteFile(t, longFile, "---\nid: "+long+"\n"+clitest.ScriptJob("webapp", "true")+"---\n# replaced\n")
	for _, args := range [][]string{{"submit", "--replace", longFile}, {"job", "rm", long}} {
		r := h.Run(t, args...)
		lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
		if r.Code != 2 || len(lines) != 1 || !strings.Contains(lines[0], "job "+long+": it is running on ") || !strings.Contains(lines[0], "nothing was changed") {
			t.Errorf("aq %v of a running job: %s", args, r)
		}
	}
	if v := show(t, h, "long"); v.Stage != job.Building || v.Title == "replaced" {
		t.Errorf("a refused --replace or rm changed the running job: %+v", v.State)
	}
	testenv.WriteFile(t, filepath.Join(mark, "go"), "")
	if r := aq.Wait(); r.Code != 0 {
		t.Fatalf("long: %s", r)
	}

	// rm: an unknown job is refused as aq job show refuses it.
	shown, rm := h.Run(t, "job", "show", "nosuch"), h.Run(t, "job", "rm", "nosuch")
	if rm.Code != 2 || rm.Code != shown.Code || rm.Stderr != shown.Stderr {
		t.Errorf("rm of an unknown job: %s\nshow: %s", rm, shown)
	}
	// rm of a shipped job whose id another job waits for.
	h.Submit(t, "waits", clitest.ScriptJob("webapp", "true", "deps: [nosuch-dep]"))
	waits := testenv.ID("waits")
	f := filepath.Join(dir, "waits.md")
	testenv.WriteFile(t, f, "---\nid: "+waits+"\n"+clitest.ScriptJob("webapp", "true", "deps: ["+id+"]", "capabilities: [has:no-such-tool]")+"---\n# w\n")
	if r := h.Run(t, "submit", "--replace", f); r.Code != 0 || !strings.Contains(r.Stdout, "replaced "+waits+" (it was in blocked): now in inbox") {
		t.Fatalf("replace of a blocked job: %s", r)
	}
	r = h.Run(t, "job", "rm", id)
	if r.Code != 0 || r.Stdout != "removed "+id+" from the queue (it was in shipped); its worktree and branches are left to aq gc, which never deletes unmerged work\n" ||
		!strings.Contains(r.Stderr, "aq: warning: "+waits+" name "+id+" in their deps") {
		t.Fatalf("job rm: %s", r)
	}
	if r := h.Run(t, "job", "show", id); r.Code != 2 {
		t.Errorf("the removed job is still shown: %s", r)
	}
	testenv.Git(t, filepath.Join(h.RepoBase, "webapp"), "rev-parse", "--verify", "aq/job/"+id) // its branch is left to gc
	r = h.Run(t, "job", "rm", waits)
	if r.Code != 0 || r.Stderr != "" {
		t.Errorf("rm of a blocked job: %s", r)
	}
	// --replace of a job that does not exist submits it.
	if r := h.Run(t, "submit", "--replace", file); r.Code != 0 || r.Stdout != "submitted "+id+" to inbox\n" {
		t.Errorf("--replace of an unknown job: %s", r)
	}
	if v := show(t, h, "norepo"); v.Attempts != 0 || len(v.History) != 1 {
		t.Errorf("submitted again after rm: the old job's state is back: %+v", v.State)
	}
}
