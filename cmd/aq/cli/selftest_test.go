package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestSelftestUsageErrors(t *testing.T) {
	cleanEnv(t)
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
	cleanEnv(t)
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
	cleanEnv(t)
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

// TestSelftestGitMissing runs the built binary with git off PATH: the host
// group fails (exit 1) and the git check says why in one line.
func TestSelftestGitMissing(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	bin := testenv.BuildAQ(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "bin")
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"sh", "sleep"} {
		if p, err := exec.LookPath(tool); err == nil {
			if err := os.Symlink(p, filepath.Join(path, tool)); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := []string{"PATH=" + path, "HOME=" + dir, "XDG_CONFIG_HOME=" + filepath.Join(dir, "xdg"), "AQ_HOME=" + filepath.Join(dir, "aqhome"), "GORACE=atexit_sleep_ms=0"}
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}
	out, errOut, code := run("selftest", "--group", "host")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	line := regexp.MustCompile(`(?m)^FAIL  host\.git\.present +\d+ms  git is not on PATH: install git \(>= 2\.36\)$`)
	if !line.MatchString(out) || !strings.Contains(out, "failed: host.git.present\n") {
		t.Fatalf("no clear FAIL line for git:\n%s", out)
	}
	out, _, code = run("selftest", "--group", "host", "--json")
	var rep struct {
		OK     bool
		Checks []struct{ Name, Status, Reason string }
	}
	if code != 1 || json.Unmarshal([]byte(out), &rep) != nil || rep.OK {
		t.Fatalf("--json: exit %d, %s", code, out)
	}
	for _, c := range rep.Checks {
		if c.Name == "host.git.present" && (c.Status != "fail" || !strings.Contains(c.Reason, "git is not on PATH")) {
			t.Errorf("host.git.present %+v", c)
		}
	}
}

// TestSelftestEnginesGroup: the engines group is listed and run only when
// asked (--engines, --group engines), and --engines on this command is the
// group's switch, not the AQ_ENGINES key's flag: the configuration does not
// read "true" as a list of engines (a run with it starts, its engine check
// skipped where no claude is on PATH).
func TestSelftestEnginesGroup(t *testing.T) {
	cleanEnv(t)
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
