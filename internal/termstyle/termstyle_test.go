package termstyle_test

import (
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/aqfleet/aq/internal/termstyle"
	// Linked in as in aq (the board imports it): its init is the one that
	// would query the terminal.
	_ "github.com/charmbracelet/bubbletea"
)

// An external test package: termstyle itself must not import Bubble Tea.

// TestInitRunsBeforeBubbleTea guards the init order the package relies on:
// this test binary, re-run with GODEBUG=inittrace=1 (the runtime prints each
// package's init as it runs it), initialises termstyle after Lip Gloss and
// before Bubble Tea. It fails if the package is renamed to a path that sorts
// after github.com/charmbracelet/bubbletea, if it imports something Bubble
// Tea does not (and so becomes ready later), or if its init does nothing.
func TestInitRunsBeforeBubbleTea(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("re-run: %v\n%s", err, out)
	}
	pos := func(pkg string) int {
		loc := regexp.MustCompile(`(?m)^init ` + regexp.QuoteMeta(pkg) + ` @`).FindIndex(out)
		if loc == nil {
			t.Fatalf("no init of %s in the trace:\n%s", pkg, out)
		}
		return loc[0]
	}
	lg, ts, bt := pos("github.com/charmbracelet/lipgloss"), pos("github.com/aqfleet/aq/internal/termstyle"), pos("github.com/charmbracelet/bubbletea")
	if !(lg < ts && ts < bt) {
		t.Errorf("init order: lipgloss at %d, termstyle at %d, bubbletea at %d; want lipgloss < termstyle < bubbletea", lg, ts, bt)
	}
}

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		flag bool
		env  map[string]string
		want bool
	}{
		{false, nil, false},
		{true, nil, true},
		{false, map[string]string{"NO_COLOR": "1"}, true},
		{false, map[string]string{"NO_COLOR": ""}, false}, // no-color.org: set and not empty
		{false, map[string]string{"TERM": "dumb"}, true},
		{false, map[string]string{"TERM": "xterm-256color"}, false},
	} {
		if got := termstyle.Plain(tc.flag, func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Plain(%v, %v) = %v, want %v", tc.flag, tc.env, got, tc.want)
		}
	}
}
