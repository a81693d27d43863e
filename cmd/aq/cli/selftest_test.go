package cli

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
)

func TestSelftestUsageErrors(t *testing.T) {
	clitest.CleanEnv(t)
	for _, args := range [][]string{
		{"selftest", "--group", "cloud"},
		{"selftest", "--only", "("},
		{"selftest", "--only", "no-such-check"},
		{"selftest", "extra"},
	} {
		out, errOut, code := runAQ(t, args...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, "aq: ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

func TestSelftestList(t *testing.T) {
	clitest.CleanEnv(t)
	out, _, code := runAQ(t, "selftest", "--list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) < 60 {
		t.Fatalf("code %d, %d lines", code, len(lines))
	}
	out, _, code = runAQ(t, "selftest", "--list", "--json")
	var checks []struct{ Name, Group, Description string }
	if code != 0 || json.Unmarshal([]byte(out), &checks) != nil {
		t.Fatalf("code %d, %q", code, out)
	}
	names := map[string]bool{}
	for _, c := range checks {
		if c.Name == "" || c.Description == "" || (c.Group != "host" && c.Group != "pipeline") {
			t.Errorf("check %+v", c)
		}
		names[c.Name] = true
	}
	if len(names) < 60 || len(names) != len(checks) {
		t.Fatalf("%d distinct names of %d checks", len(names), len(checks))
	}
	out, _, _ = runAQ(t, "selftest", "--list", "--group", "host", "--only", `^host\.git\.`)
	if got := strings.Fields(out); len(got) < 2 || got[0] != "host.git.present" {
		t.Errorf("filtered list %q", out)
	}
}

// TestSelftestJSON: the --json report has its documented fields.
func TestSelftestJSON(t *testing.T) {
	clitest.CleanEnv(t)
	out, errOut, code := runAQ(t, "selftest", "--json", "--only", `^host\.clock\.monotonic$|^pipeline\.manifest\.`)
	if code != 0 {
		t.Fatalf("code %d\n%s\n%s", code, out, errOut)
	}
	var rep map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ok", "version", "startedAt", "durationMs", "counts", "checks"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("no %q in %s", k, out)
		}
	}
	var counts map[string]int
	var checks []map[string]any
	json.Unmarshal(rep["counts"], &counts)
	json.Unmarshal(rep["checks"], &checks)
	if counts["total"] != len(checks) || counts["pass"] != len(checks) || len(checks) != 5 {
		t.Fatalf("counts %v, %d checks", counts, len(checks))
	}
	for _, c := range checks {
		keys := make([]string, 0, len(c))
		for k := range c {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"durationMs", "group", "name", "reason", "status"}) {
			t.Errorf("check fields %v", keys)
		}
	}
}

// TestSelftestEnginesGroup: the engines group is listed and run only when
// asked (--engines, --group engines), and --engines on this command is the
// group's switch, not the AQ_ENGINES key's flag: the configuration does not
// read "true" as a list of engines (a run with it starts, its engine check
// skipped where no claude is on PATH).
func TestSelftestEnginesGroup(t *testing.T) {
	clitest.CleanEnv(t)
	t.Setenv("PATH", "/usr/bin:/bin") // no claude here
	list := func(args ...string) []string {
		t.Helper()
		out, errOut, code := runAQ(t, append([]string{"selftest", "--list", "--json"}, args...)...)
		var checks []struct{ Name, Group string }
		if code != 0 || json.Unmarshal([]byte(out), &checks) != nil {
			t.Fatalf("selftest --list --json %v: %d %q %q", args, code, out, errOut)
		}
		var names []string
		for _, c := range checks {
			if c.Group == "engines" {
				names = append(names, c.Name)
			}
		}
		return names
	}
	if got := list(); len(got) != 0 {
		t.Errorf("a default --list names the engines group: %v", got)
	}
	if got := list("--engines"); len(got) == 0 || got[0] != "engines.claude" {
		t.Errorf("--list --engines: engines group %v, want engines.claude first", got)
	}
	if got := list("--group", "engines"); len(got) == 0 || got[0] != "engines.claude" {
		t.Errorf("--list --group engines: %v", got)
	}
	out, errOut, code := runAQ(t, "selftest", "--engines", "--only", `^engines\.claude$`)
	if code != 0 || !strings.Contains(out, "SKIP  engines.claude") || !strings.Contains(out, "claude is not installed here") {
		t.Errorf("selftest --engines without claude: %d %q %q", code, out, errOut)
	}
}
