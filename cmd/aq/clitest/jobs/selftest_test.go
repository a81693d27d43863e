//go:build !unit

package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

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
