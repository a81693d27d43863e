package sandboxed

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestHostileLeftovers is the hostile-engine suite's part for what an
// engine leaves behind (#32, docs/sandbox.md "What aq reads from the
// engine's trees"): one real sandboxed job, recovered after a crash whose
// engine had planted its job directory, whose engine then
//
//   - makes .aq_pr.md a symbolic link to the user's gh login (before
//     internal/safefs aq followed it: the gh token became the job's pr.md
//     and, with ship: pr, the pull request's body);
//   - rewrites the worktree's .git to point at another repository (before
//     the GIT_DIR pin, aq's checkpoint and commit went there);
//   - replaces .gitignore with a FIFO (before the sweep, aq's git add hung
//     on it until the job's wall ran out, and git clean left it for the
//     pool's next job);
//   - looks for what the crashed attempt planted in its home and tmp
//     (before FreshJobDir, a recovered attempt's engine found it all);
//
// and the job still ships its work to its own repository, each refusal in
// its insights; then the factory runs a plain job in the same AQ_HOME.
func TestHostileLeftovers(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are blocked on this host: no full sandbox to test")
	}
	h := clitest.BinHome(t)
	userHome := t.TempDir()
	ghToken := "gho_hostileleftoverfaketoken0123"
	testenv.WriteFile(t, filepath.Join(userHome, ".config", "gh", "hosts.yml"), "github.com:\n  oauth_token: "+ghToken+"\n")
	h.Env = append(h.Env, "HOME="+userHome, "AQ_SANDBOX=auto", "AQ_WORKTREE_POOL=1")
	h.Repo(t, "app", map[string]string{"README.md": "app\n", ".gitignore": "*.log\n"})
	other := h.Repo(t, "other", map[string]string{"secret.txt": "another product's secret\n"})
	otherRefs := testenv.Git(t, other, "for-each-ref", "--format=%(refname) %(objectname)")

	id := testenv.ID("leftovers")
	// The crashed attempt's engine planted its job directory.
	jobDir := filepath.Join(h.Dir, "sandbox", id)
	testenv.WriteFile(t, filepath.Join(jobDir, "home", "planted"), "from the crashed attempt")
	testenv.WriteFile(t, filepath.Join(jobDir, "tmp", "planted"), "from the crashed attempt")
	if err := os.Symlink(filepath.Join(userHome, ".config", "gh", "hosts.yml"), filepath.Join(jobDir, "home", "login-link")); err != nil {
		t.Fatal(err)
	}

	script := `for f in "$HOME/planted" "$TMPDIR/planted" "$HOME/login-link"; do
  if [ -e "$f" ] || [ -L "$f" ]; then echo "$f" >> seen-planted.txt; fi
done
echo work > work.txt
ln -s "` + filepath.Join(userHome, ".config", "gh", "hosts.yml") + `" .aq_pr.md
rm -f .gitignore && mkfifo .gitignore
printf 'gitdir: %s\n' "` + filepath.Join(other, ".git") + `" > .git`
	h.Submit(t, "leftovers", clitest.ScriptJob("app", script, "ship: branch", "retry: {max: 0}"))
	r := h.Run(t, "run", "--once")
	if r.Code != 0 {
		t.Fatalf("the hostile job did not ship: %s", r)
	}
	v := show(t, h, "leftovers")
	if v.State.Stage != job.Shipped {
		t.Fatalf("the job is %s, want shipped", v.State.Stage)
	}
	app := filepath.Join(h.RepoBase, "app")
	files := testenv.TreeFiles(t, app, job.JobBranch(id))
	if files["work.txt"] != "work" {
		t.Errorf("the job's work on its branch: %v", files)
	}
	if seen, ok := files["seen-planted.txt"]; ok {
		t.Errorf("the engine found what the crashed attempt planted:\n%s", seen)
	}
	if _, ok := files[".aq_pr.md"]; ok {
		t.Error(".aq_pr.md was committed")
	}
	if got := testenv.Git(t, other, "for-each-ref", "--format=%(refname) %(objectname)"); got != otherRefs {
		t.Errorf("the other repository's refs changed:\n%s\nwas\n%s", got, otherRefs)
	}
	logs := filepath.Join(h.Dir, "logs", id)
	filepath.WalkDir(logs, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), ghToken) {
				t.Errorf("the gh token reached the job's logs: %s", p)
			}
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(logs, "pr.md")); err == nil {
		t.Error("logs/pr.md was written from the link")
	}
	var refused []string
	for _, u := range v.State.Insights.UntrustedFiles {
		refused = append(refused, u.Tree+"/"+u.Path+": "+u.Why)
	}
	for _, want := range []string{"worktree/.aq_pr.md: a symbolic link", "worktree/.gitignore: a FIFO (removed)", "worktree/.git: rewritten by the engine (restored from aq's record)"} {
		if !slices.Contains(refused, want) {
			t.Errorf("insights' untrusted files %q lack %q", refused, want)
		}
	}

	// The factory goes on: a plain job in the same AQ_HOME ships (it may
	// take the pooled worktree the hostile job left).
	h.Submit(t, "plain-after", clitest.ScriptJob("app", "echo plain > plain.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("a plain job after the hostile one: %s", r)
	}
	if got := testenv.TreeFiles(t, app, job.JobBranch(testenv.ID("plain-after"))); got["plain.txt"] != "plain" {
		t.Errorf("the plain job's work: %v", got)
	}
}
