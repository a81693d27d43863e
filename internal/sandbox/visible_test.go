package sandbox

import "testing"

func TestPolicyVisible(t *testing.T) {
	p := Policy{
		Worktree:    "/home/u/.aq/worktrees/webapp/j1",
		GitDirs:     []string{"/home/u/src/webapp/.git"},
		Home:        "/home/u",
		JobDir:      "/home/u/.aq/sandbox/j1",
		Hidden:      []string{"/home/u/.aq", "/home/u/src", "/run"},
		HiddenFiles: []string{"/etc/shadow"},
		ReadOnly:    []string{"/home/u/.local/bin"},
		Shared:      []string{"/tmp/shared-cache"},
		Caches:      []string{"/home/u/go/pkg/mod"},
	}
	for _, tc := range []struct {
		path string
		ok   bool
		why  string
	}{
		{"fix.sh", true, ""},                                 // relative: the worktree's
		{"/usr/bin/make", true, ""},                          // the host, read-only
		{"/home/u/.aq/worktrees/webapp/j1/fix.sh", true, ""}, // the worktree, below a hidden tree
		{"/home/u/src/webapp/.git/hooks/x", true, ""},        // the job's git metadata
		{"/home/u/.aq/sandbox/j1/tmp/x", true, ""},           // the job's own directory
		{"/home/u/.local/bin/tool", true, ""},                // a toolchain below the home
		{"/home/u/go/pkg/mod/x", true, ""},                   // a cache below the home
		{"/tmp/shared-cache/x", true, ""},                    // AQ_SANDBOX_WRITABLE
		{"/tmp/fix.sh", false, "/tmp is the job's own inside the sandbox"},
		{"/tmp", false, "/tmp is the job's own inside the sandbox"},
		{"/var/tmp/x/../fix.sh", false, "/var/tmp is the job's own inside the sandbox"},
		{"/tmpfoo/fix.sh", true, ""}, // not below /tmp
		{"/home/u/bin/fix.sh", false, "/home/u (the home) is the job's own inside the sandbox"},
		{"/home/u/src/other/x", false, "/home/u/src is hidden inside the sandbox"},
		{"/home/u/.aq/queue/inbox/x.md", false, "/home/u/.aq is hidden inside the sandbox"},
		{"/run/user/0/x", false, "/run is hidden inside the sandbox"},
		{"/etc/shadow", false, "/etc/shadow is hidden inside the sandbox"},
	} {
		ok, why := p.Visible(tc.path)
		if ok != tc.ok || why != tc.why {
			t.Errorf("Visible(%q) = %v, %q; want %v, %q", tc.path, ok, why, tc.ok, tc.why)
		}
	}
}
