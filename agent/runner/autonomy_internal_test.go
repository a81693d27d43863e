package runner

import "testing"

func TestAutonomy(t *testing.T) {
	for _, tc := range []struct {
		perm, codex string
		sandboxed   bool
		wantPerm    string
		wantCodex   string
	}{
		{"", "", true, "bypassPermissions", "danger-full-access"},
		{"", "", false, "acceptEdits", "workspace-write"},
		{"acceptEdits", "", true, "acceptEdits", "danger-full-access"}, // an explicit mode wins
		{"", "read-only", true, "bypassPermissions", "read-only"},
		{"plan", "workspace-write", false, "plan", "workspace-write"},
		{"bypassPermissions", "danger-full-access", false, "bypassPermissions", "danger-full-access"},
	} {
		p, c := autonomy(tc.perm, tc.codex, tc.sandboxed)
		if p != tc.wantPerm || c != tc.wantCodex {
			t.Errorf("autonomy(%q, %q, %v) = %q, %q; want %q, %q", tc.perm, tc.codex, tc.sandboxed, p, c, tc.wantPerm, tc.wantCodex)
		}
	}
}
