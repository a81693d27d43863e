//go:build !unit

package termtest

import (
	"regexp"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestBoardWithoutColour: with NO_COLOR, or --no-color, the board draws no
// style at all (no reverse video, no colour) and the selected row keeps
// its text marker "> "; with neither, the selected row is in reverse video
// (so the check can fail).
func TestBoardWithoutColour(t *testing.T) {
	t.Parallel()
	h := testenv.NewHome(t)
	h.Bin = testenv.BuildAQ(t)
	h.Repo(t, "webapp", nil)
	id := testenv.ID("nocolour")
	h.Submit(t, "nocolour", "repo: webapp\nengine: script\nscript: true\nship: none")
	sgr := regexp.MustCompile(`\x1b\[[0-9;]*m`)
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		plain bool
	}{
		{"NO_COLOR", []string{"NO_COLOR=1"}, nil, true},
		{"--no-color", nil, []string{"--no-color"}, true},
		{"colour", nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := testenv.StartTmux(t, termEnv(h, tc.env...), 100, 30, shellLine(h.RepoBase, append(append([]string{h.Bin}, tc.args...), "status", "--watch")...))
			x.WaitText("> " + id)
			styled := x.Screen(true)
			var styles []string
			for _, m := range sgr.FindAllString(styled, -1) {
				if m != "\x1b[0m" && m != "\x1b[m" && m != "\x1b[39m" && m != "\x1b[49m" {
					styles = append(styles, m)
				}
			}
			if tc.plain && len(styles) > 0 {
				t.Errorf("styles on the board: %q", styles)
			}
			if !tc.plain && !regexp.MustCompile(`\x1b\[(?:[0-9]+;)*7m(?:\x1b\[[0-9;]*m)*> `+regexp.QuoteMeta(id)).MatchString(styled) {
				t.Errorf("the selected row is not in reverse video:\n%q", styled)
			}
			x.Keys("q")
			x.WaitText("EXITED 0")
		})
	}
}

// TestNarrowTerminal: at 20 columns the board draws and quits, and aq run
// --once shows its live line and result without a panic, leaving no part
// of the block behind.
func TestNarrowTerminal(t *testing.T) {
	t.Parallel()
	h, _, env := liveHome(t, "printf '<title>Hello</title>\\n' > index.html")
	id := testenv.ID("narrow")
	h.Submit(t, "narrow", "repo: webapp\nengine: claude\nverify: grep -q Hello index.html\nship: branch")
	x := testenv.StartTmux(t, env, 20, 20, shellLine(h.RepoBase, h.Bin, "status", "--watch"))
	x.WaitText("aq")
	x.Keys("q")
	if s := x.WaitText("EXITED"); !strings.Contains(s, "EXITED 0") || strings.Contains(s, "panic") {
		t.Fatalf("the board at 20 columns:\n%s", s)
	}
	x = testenv.StartTmux(t, env, 20, 20, shellLine(h.RepoBase, h.Bin, "run", "--once"))
	s := x.WaitText(id[:10])
	for _, l := range strings.Split(s, "\n") {
		if len([]rune(l)) > 20 {
			t.Errorf("a line wider than the terminal: %q", l)
		}
	}
	final := x.WaitText("EXITED")
	if !strings.Contains(final, "EXITED 0") || strings.Contains(final, "panic") {
		t.Fatalf("aq run at 20 columns:\n%s", final)
	}
	flat := strings.ReplaceAll(final, "\n", "")
	if !strings.Contains(flat, "job "+id+": shipped") {
		t.Errorf("no result line at 20 columns:\n%s", final)
	}
	if blockLine(id).MatchString(final) {
		t.Errorf("the live block was left on the screen:\n%s", final)
	}
}
