package preflight

import (
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
)

// The hidden-path warning for a script: file and for a verify program,
// with the sandbox's real policy for a home and an AQ_HOME.
func TestCheckHiddenPaths(t *testing.T) {
	p := sandbox.NewPolicy(sandbox.Paths{Home: "/home/u", Shared: []string{"/tmp/shared"}})
	p.Hidden = []string{"/home/u/.aq"} // NewPolicy keeps only existing trees
	h := Host{RepoBase: t.TempDir(), LookPath: installed(), Visible: p.Visible, Home: "/home/u"}
	for _, tc := range []struct {
		name string
		j    job.Job
		want []string
	}{
		{"a script under /tmp", job.Job{Engine: "script", Script: "/tmp/fix.sh"},
			[]string{"script: names /tmp/fix.sh, which the job's sandbox hides: /tmp is the job's own inside the sandbox, so the job would fail as if it were missing (put it in the repository, name its folder in AQ_SANDBOX_WRITABLE, or set AQ_SANDBOX=off)"}},
		{"a verify program in the home", job.Job{Engine: "script", Script: "true", Verify: "~/bin/check ./..."},
			[]string{"verify: names /home/u/bin/check, which the job's sandbox hides: /home/u (the home) is the job's own inside the sandbox"}},
		{"a verify path under AQ_HOME", job.Job{Engine: "claude", Verify: "sh /home/u/.aq/check.sh"},
			[]string{"verify: names /home/u/.aq/check.sh, which the job's sandbox hides: /home/u/.aq is hidden inside the sandbox"}},
		{"in the repository", job.Job{Engine: "script", Script: "./fix.sh", Verify: "make test"}, nil},
		{"a shared folder", job.Job{Engine: "script", Script: "/tmp/shared/fix.sh"}, nil},
		{"a system tool", job.Job{Engine: "script", Script: "/usr/bin/true"}, nil},
		{"a claude job's script: is not run", job.Job{Engine: "claude", Script: "/tmp/fix.sh"}, nil},
	} {
		got := h.hidden(&tc.j)
		if len(got) != len(tc.want) {
			t.Errorf("%s: %d warnings %q, want %d", tc.name, len(got), got, len(tc.want))
			continue
		}
		for i := range got {
			if !strings.HasPrefix(got[i], tc.want[i]) {
				t.Errorf("%s: warning\n%s\nwant it to start\n%s", tc.name, got[i], tc.want[i])
			}
		}
	}
	h.Visible = nil // AQ_SANDBOX=off
	if w := h.hidden(&job.Job{Engine: "script", Script: "/tmp/fix.sh"}); w != nil {
		t.Errorf("without a sandbox: %q", w)
	}
}
