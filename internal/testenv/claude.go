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
// commander answers it; a run reads its prompt (into $FAKE_PROMPT, a file
// Script may read), runs Script (shell lines, in the worktree), prints the
// stream-json file Stream and exits with Exit.
//
// With Sessions (a directory) it keeps sessions there as claude documents:
// --session-id <id> starts one (an id it has is refused: "Error: Session ID
// <id> is already in use."), --resume <id> continues one started in the
// same directory, and one it does not have is refused as claude refuses it
// (engines/testdata/claude/resume_not_found.*, exit 1); the stream carries
// the session's id. With Record (a directory) each run leaves its
// arguments (N.args, one a line) and prompt (N.prompt) there, N counting
// from 1.
type FakeClaude struct {
	Script   string // e.g. "echo wip > wip.txt"
	Stream   string // a recorded run (a file under ClaudeTestdata, or a copy)
	Exit     int
	Sessions string
	Record   string
}

// Write writes the fake as dir/claude and returns its path.
func (f FakeClaude) Write(tb testing.TB, dir string) string {
	tb.Helper()
	// A fake may run with a narrow PATH: its tools by their paths.
	var tools [3]string
	for i, name := range []string{"cat", "sed", "mktemp"} {
		p, err := exec.LookPath(name)
		if err != nil {
			tb.Skip(name + " not found")
		}
		tools[i] = p
	}
	cat, sed, mktemp := tools[0], tools[1], tools[2]
	script := fmt.Sprintf(`#!/bin/sh
case "$*" in
--version) echo "2.1.197 (Claude Code)"; exit 0;;
*--help) %[1]q %[2]q; exit 0;;
*--aq-probe-unknown-option) echo "error: unknown option '--aq-probe-unknown-option'" >&2; exit 1;;
esac
FAKE_PROMPT=$(%[9]q) || exit 90
trap 'rm -f "$FAKE_PROMPT"' EXIT
export FAKE_PROMPT
%[1]q > "$FAKE_PROMPT"
sessions=%[6]q record=%[7]q sid= resume= prev=
for a in "$@"; do
  case "$prev" in --session-id) sid=$a;; --resume|-r) resume=$a;; esac
  prev=$a
done
if [ -n "$record" ]; then
  n=1; while [ -e "$record/$n.args" ]; do n=$((n+1)); done
  printf '%%s\n' "$@" > "$record/$n.args"; %[1]q "$FAKE_PROMPT" > "$record/$n.prompt"
fi
if [ -n "$sessions" ]; then
  if [ -n "$resume" ]; then
    if [ ! -f "$sessions/$resume" ] || [ "$(%[1]q "$sessions/$resume")" != "$PWD" ]; then
      %[10]q "s/9d2b6f0e-3c1a-4e5d-8f7a-6b5c4d3e2f1a/$resume/g" %[8]q
      echo "No conversation found with session ID: $resume" >&2
      exit 1
    fi
    sid=$resume
  elif [ -n "$sid" ]; then
    if [ -f "$sessions/$sid" ]; then echo "Error: Session ID $sid is already in use." >&2; exit 1; fi
    echo "$PWD" > "$sessions/$sid"
  fi
fi
%[3]s
if [ -n "$sessions" ] && [ -n "$sid" ]; then
  %[10]q "s/\"session_id\":\"[^\"]*\"/\"session_id\":\"$sid\"/g" %[4]q
else
  %[1]q %[4]q
fi
exit %[5]d
`, cat, filepath.Join(ClaudeTestdata(tb), "help.txt"), f.Script, f.Stream, f.Exit, f.Sessions, f.Record,
		filepath.Join(ClaudeTestdata(tb), "resume_not_found.jsonl"), mktemp, sed)
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
