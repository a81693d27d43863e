package cli

import (
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
)

// The live board in a real terminal: tmux runs the aq binary, send-keys
// types, capture-pane reads the screen.

// TestStatusIntervalBadInput: --interval that does not parse, one too
// short, and --interval without --watch are usage errors (exit 2, one line).
func TestStatusIntervalBadInput(t *testing.T) {
	clitest.CleanEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--watch", "--interval", "soon"}, `invalid argument "soon" for "--interval"`},
		{[]string{"status", "--watch", "--interval", "10ms"}, "--interval 10ms is too short"},
		{[]string{"status", "--interval", "1s"}, "--interval goes with --watch"},
		{[]string{"status", "--watch", "--json"}, "--json and --watch do not go together"},
	} {
		_, errOut, code := runAQ(t, tc.args...)
		if code != 2 {
			t.Fatalf("%v: exit %d %q", tc.args, code, errOut)
		}
		clitest.OneErrLine(t, errOut, tc.want)
		if strings.Count(strings.TrimRight(errOut, "\n"), "\n") != 0 {
			t.Fatalf("%v: more than one line: %q", tc.args, errOut)
		}
	}
}
