//go:build unix

package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestPRBodyThatIsNotAFileIsRefused: an engine that leaves .aq_pr.md as a
// symbolic link to a host file, or as an oversized file, gets it refused —
// the host file's text reaches neither the PR body nor the job's logs, the
// entry is removed and not committed, the job still succeeds with the body
// aq makes from the manifest, and the refusal is in its insights. Before
// internal/safefs the link was followed: the host file became logs/pr.md.
func TestPRBodyThatIsNotAFileIsRefused(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, c := range []struct{ name, script, why string }{
		{"link", `ln -s "$MARK/hosts.yml" .aq_pr.md`, "a symbolic link"},
		{"big", `head -c 70000 /dev/zero | tr '\0' x > .aq_pr.md`, "larger than the 64 KiB cap"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			os.WriteFile(f.marker("hosts.yml"), []byte("oauth_token: gho_host_secret\n"), 0o600)
			var events []runner.UntrustedFileRefused
			j := f.job("pr-"+c.name, "echo work > work.txt\n"+c.script+"\n")
			out := f.run(context.Background(), j, runner.Options{OnEvent: func(e runner.Event) {
				if u, ok := e.(runner.UntrustedFileRefused); ok {
					events = append(events, u)
				}
			}})
			if out.Failed() {
				t.Fatalf("the job failed: %s %s", out.Reason, out.Detail)
			}
			want := job.UntrustedFile{Tree: "worktree", Path: ".aq_pr.md", Why: c.why}
			if len(out.Insights.UntrustedFiles) != 1 || out.Insights.UntrustedFiles[0] != want {
				t.Errorf("insights' untrusted files %+v, want %+v", out.Insights.UntrustedFiles, want)
			}
			if len(events) != 1 || events[0].File != want {
				t.Errorf("events %+v, want one for %+v", events, want)
			}
			if b, err := os.ReadFile(filepath.Join(f.home.Dir, "logs", j.ID, "pr.md")); err == nil {
				t.Errorf("logs/pr.md was written: %.80q", b)
			}
			files := testenv.TreeFiles(t, f.repo, out.Commit)
			if _, ok := files[".aq_pr.md"]; ok {
				t.Error(".aq_pr.md was committed")
			}
			if files["work.txt"] != "work" {
				t.Errorf("the job's work: %q", files["work.txt"])
			}
			if b, _ := os.ReadFile(f.marker("hosts.yml")); !strings.Contains(string(b), "gho_host_secret") {
				t.Errorf("the link's target changed: %q", b)
			}
		})
	}
}
