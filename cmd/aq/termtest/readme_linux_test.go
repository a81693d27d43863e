//go:build !unit

package termtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestReadmeQuickStartInATerminal runs the README's quick start as written
// in a real terminal (tmux), as a person pastes it into a shell: the
// screen shows the commands' lines the README quotes, aq run's result line
// and no log line (the live line is erased before the result).
func TestReadmeQuickStartInATerminal(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildAQ(t)
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- quickstart:")
	if !ok {
		t.Fatal("README.md has no quick start marker")
	}
	_, rest, _ = strings.Cut(rest, "\n```sh\n")
	block, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatal("the quick start block is not closed")
	}
	tmp := t.TempDir()
	script := filepath.Join(tmp, "quickstart.sh")
	testenv.WriteFile(t, script, block+"\n")
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AQ_") || k == "HOME" || k == "TMPDIR" || k == "PATH" || k == "TMUX" || k == "NO_COLOR" {
			continue
		}
		env = append(env, kv)
	}
	home := filepath.Join(tmp, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "HOME="+home, "TMPDIR="+tmp)
	env = append(env, testenv.Identity...)
	x := testenv.StartTmux(t, env, 120, 40, "sh -e "+shellQuote(script))
	x.WaitText("EXITED")
	out, err := x.Cmd("capture-pane", "-p", "-t", "aq", "-S", "-").Output() // with what scrolled away
	if err != nil {
		t.Fatal(err)
	}
	final := string(out)
	for _, want := range []string{
		"EXITED 0",
		"ok fix-title.md id=fix-title repo=webapp engine=script",
		"submitted fix-title to inbox",
		"job fix-title: shipped (aq/job/fix-title, 1 files +1/-1; engine script",
		"<title>Hello</title>",
	} {
		if !strings.Contains(final, want) {
			t.Errorf("the quick start in a terminal lacks %q:\n%s", want, final)
		}
	}
	for _, no := range []string{"level=", "msg=", "fix-title  engine", "fix-title  verify", "fix-title  preparing", "fix-title  shipping"} {
		if strings.Contains(final, no) {
			t.Errorf("the quick start in a terminal shows %q:\n%s", no, final)
		}
	}
}
