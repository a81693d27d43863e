package sandbox

import (
	"slices"
	"testing"
)

func TestCommandPaths(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"printf 'x' > index.html", nil},
		{"/tmp/fix.sh", []string{"/tmp/fix.sh"}},
		{"sh /tmp/fix.sh --flag", []string{"/tmp/fix.sh"}},
		{"~/bin/check && make test", []string{"/home/u/bin/check"}},
		{`"$HOME/bin/check" ./...`, []string{"/home/u/bin/check"}},
		{"${HOME}/tools/lint", []string{"/home/u/tools/lint"}},
		{"go test ./... > /tmp/log 2>&1", nil}, // written to: the job's own /tmp is fine
		{"go test ./... 2>/tmp/err; /opt/x/check", []string{"/opt/x/check"}},
		{"grep -q Hello index.html", nil},
		{"run --config=/etc/x.yaml < /srv/input", []string{"/etc/x.yaml", "/srv/input"}},
		{"CHECK=/tmp/check.sh make verify", []string{"/tmp/check.sh"}},
		{"a /tmp/x; b /tmp/x", []string{"/tmp/x"}}, // once
		{"'/tmp/with space/fix.sh'", []string{"/tmp/with space/fix.sh"}},
	} {
		got := CommandPaths(tc.cmd, "/home/u")
		if !slices.Equal(got, tc.want) {
			t.Errorf("CommandPaths(%q) = %q, want %q", tc.cmd, got, tc.want)
		}
	}
}
