//go:build unix && !unit

package jobs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestJobsRunNothingPlanted (#23 item 3, end to end, AQ_SANDBOX=off): a job's engine
// plants in its repository's git configuration and git directory
// everything that makes git run a program or send a push elsewhere — in
// the shared config, in its worktree's own config, through an include and
// an include that holds on aq's branches only, and as hook files — on top
// of what was planted before it ran. aq still runs that job (checkpoint,
// verify, commit, push), a second job in the same repository (the pooled
// worktree reset and reused) and aq gc, and runs none of it. A plain git
// in the same repository runs the plants, so the test can tell. The
// origin's own hooks are origin's business: they run for aq's pushes, as
// for anyone's.
func TestJobsRunNothingPlanted(t *testing.T) {
	h := clitest.BinHome(t)
	// The engine plants in the repository's .git, which a sandbox keeps
	// read-only to it: this is the guarantee that holds without one.
	h.Env = append(h.Env, "AQ_SANDBOX=off")
	repo := h.Repo(t, "app", map[string]string{"README.md": "# app\n"})
	origin := testenv.AddOrigin(t, repo)
	evil := filepath.Join(t.TempDir(), "evil.git")
	testenv.Git(t, "", "init", "-q", "--bare", evil)

	dir := t.TempDir()
	marks := filepath.Join(dir, "marks")
	plant := filepath.Join(dir, "plant")
	testenv.WriteFile(t, plant, "#!/bin/sh\necho \"$0 $*\" >> '"+marks+"'\nexit 0\n")
	originMarks := filepath.Join(dir, "origin-marks")
	for _, hook := range []string{"pre-receive", "update", "post-receive"} {
		p := filepath.Join(origin, "hooks", hook)
		testenv.WriteFile(t, p, "#!/bin/sh\necho "+hook+" >> '"+originMarks+"'\nexit 0\n")
		os.Chmod(p, 0o755)
	}
	if err := os.Chmod(plant, 0o755); err != nil {
		t.Fatal(err)
	}
	hooks := filepath.Join(dir, "hooks")
	for _, hook := range []string{"pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout",
		"pre-push", "reference-transaction", "post-index-change", "pre-auto-gc", "post-merge", "post-rewrite"} {
		testenv.WriteFile(t, filepath.Join(hooks, hook), "#!/bin/sh\nexec '"+plant+"' "+hook+"\n")
		os.Chmod(filepath.Join(hooks, hook), 0o755)
	}

	// Planted before any job: in the shared config and through includes.
	gitDir := filepath.Join(repo, ".git")
	testenv.Git(t, repo, "config", "include.path", "planted.cfg")
	testenv.Git(t, repo, "config", "includeIf.onbranch:aq/**.path", "onbranch.cfg")
	testenv.Git(t, repo, "config", "-f", filepath.Join(gitDir, "planted.cfg"), "remote.origin.uploadpack", plant)
	testenv.Git(t, repo, "config", "-f", filepath.Join(gitDir, "planted.cfg"), "merge.planted.driver", plant+" %A")
	testenv.Git(t, repo, "config", "-f", filepath.Join(gitDir, "onbranch.cfg"), "core.fsmonitor", plant)
	testenv.Git(t, repo, "config", "-f", filepath.Join(gitDir, "onbranch.cfg"), "filter.planted.process", plant)
	for _, kv := range [][2]string{
		{"core.hooksPath", hooks},
		{"core.alternateRefsCommand", plant},
		{"core.sshCommand", plant},
		{"core.askPass", plant},
		{"credential.helper", plant},
		{"gpg.program", plant},
		{"core.editor", plant},
		{"sequence.editor", plant},
		{"diff.external", plant},
		{"url." + evil + ".pushInsteadOf", origin},
	} {
		testenv.Git(t, repo, "config", kv[0], kv[1])
	}
	testenv.WriteFile(t, filepath.Join(gitDir, "objects", "info", "alternates"), filepath.Join(origin, "objects")+"\n")

	// Planted by the first job's engine, as it works: in the shared config,
	// its worktree's own config, attributes and a hook file.
	engine := `echo work > work.txt
printf '* filter=planted diff=planted merge=planted\n' > .gitattributes
printf '# the job\n' > README.md
common=$(git rev-parse --git-common-dir)
git config extensions.worktreeConfig true
git config --worktree core.fsmonitor "$PLANT"
git config filter.planted.clean "$PLANT"
git config filter.planted.smudge "$PLANT"
git config filter.planted.required true
git config diff.planted.textconv "$PLANT"
git config diff.planted.command "$PLANT"
git config remote.origin.receivepack "$PLANT"
cp "$PLANT" "$common/hooks/post-checkout"
cp "$PLANT" "$common/hooks/reference-transaction"
printf '* filter=planted diff=planted merge=planted\n' > "$common/info/attributes"`
	// The engine's environment is built (docs/engines.md): PLANT reaches
	// it because AQ_ENGINE_ENV names it.
	h.Env = append(h.Env, "PLANT="+plant, "AQ_ENGINE_ENV=PLANT")
	h.Submit(t, "first", clitest.ScriptJob("app", engine, "verify: test -f work.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("first job: %s", r)
	}
	if got := testenv.Git(t, repo, "config", "--get", "filter.planted.clean"); got != plant { // the engine did plant
		t.Fatalf("the engine planted filter.planted.clean=%q, want %q", got, plant)
	}
	h.Submit(t, "second", clitest.ScriptJob("app", "echo second > second.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("second job: %s", r)
	}
	if r := h.Run(t, "gc"); r.Code != 0 {
		t.Fatalf("aq gc: %s", r)
	}
	for _, name := range []string{"first", "second"} {
		if v := show(t, h, name); v.Stage != job.Shipped {
			t.Errorf("job %s: stage %s, want shipped", name, v.Stage)
		}
		ref := "refs/heads/aq/job/" + testenv.ID(name)
		if testenv.RemoteRefs(t, origin, "refs/heads/aq/job/")[ref] == "" {
			t.Errorf("%s is not on origin", ref)
		}
		if testenv.RemoteRefs(t, evil, "refs/heads/")[ref] != "" {
			t.Errorf("%s was pushed where the planted pushInsteadOf points", ref)
		}
	}
	if b, _ := os.ReadFile(marks); len(b) > 0 {
		t.Errorf("aq's git ran what was planted:\n%s", b)
	}
	if b, _ := os.ReadFile(originMarks); !strings.Contains(string(b), "post-receive") {
		t.Errorf("origin's own hooks did not run for aq's pushes (%q): they are origin's business", b)
	}

	// The control: a plain git in the same repository runs the plants.
	plain := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), testenv.Identity...)
		cmd.Run() // the plants make most of it fail: what matters is what ran
	}
	plain(repo, "checkout", "-q", "-b", "aq/control")
	testenv.WriteFile(t, filepath.Join(repo, "x.txt"), "x\n")
	plain(repo, "add", "-A")
	plain(repo, "status")
	plain(repo, "fetch", "origin")
	plain(repo, "push", "origin", "HEAD:refs/heads/control")
	b, _ := os.ReadFile(marks)
	if len(b) == 0 {
		t.Fatal("a plain git ran none of the plants: the test proves nothing")
	}
	// Hooks from core.hooksPath, the fsmonitor (protocol 2), the planted
	// upload-pack (fetching from origin) and receive-pack (pushing to
	// where pushInsteadOf points).
	ran := string(b)
	for _, want := range []string{"post-checkout", "reference-transaction", plant + " 2 ", origin, evil} {
		if !strings.Contains(ran, want) {
			t.Errorf("a plain git did not run the plant that says %q:\n%s", want, ran)
		}
	}
}
