package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ClaudeTestdata is engines/testdata/claude: recordings of the real claude
// CLI (its --help, stream-json runs) that fake claudes replay.
func ClaudeTestdata(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("testenv: cannot locate its own source")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "engines", "testdata", "claude")
}

// FakeClaude is a claude CLI for tests that behaves as the real 2.1.197
// does where aq looks: --version and --help as recorded
// (engines/testdata/claude/help.txt), the hidden-flag probe answered as
// commander answers it; a run reads its prompt, runs Script (shell lines, in
// the worktree), prints the stream-json file Stream and exits with Exit.
type FakeClaude struct {
	Script string // e.g. "echo wip > wip.txt"
	Stream string // a recorded run (a file under ClaudeTestdata, or a copy)
	Exit   int
}

// Write writes the fake as dir/claude and returns its path.
func (f FakeClaude) Write(tb testing.TB, dir string) string {
	tb.Helper()
	cat, err := exec.LookPath("cat") // a fake may run with a narrow PATH
	if err != nil {
		tb.Skip("cat not found")
	}
	script := fmt.Sprintf(`#!/bin/sh
case "$*" in
--version) echo "2.1.197 (Claude Code)"; exit 0;;
*--help) %[1]q %[2]q; exit 0;;
*--aq-probe-unknown-option) echo "error: unknown option '--aq-probe-unknown-option'" >&2; exit 1;;
esac
%[1]q > /dev/null
%[3]s
%[1]q %[4]q
exit %[5]d
`, cat, filepath.Join(ClaudeTestdata(tb), "help.txt"), f.Script, f.Stream, f.Exit)
	p := filepath.Join(dir, "claude")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	return p
}

// RateLimitedStream writes, in dir, claude's recorded rejected
// rate_limit_event run with its resetsAt moved to reset, and returns its
// path (a FakeClaude's Stream).
func RateLimitedStream(tb testing.TB, dir string, reset time.Time) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(ClaudeTestdata(tb), "rate_limit_event.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, "stream.jsonl")
	WriteFile(tb, p, strings.ReplaceAll(string(b), `"resetsAt":1778565600`, fmt.Sprintf(`"resetsAt":%d`, reset.Unix())))
	return p
}
