package engines

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestExecLogs: stdout and stderr go to their own log files, each run
// appended under a header naming the job and attempt.
func TestExecLogs(t *testing.T) {
	spec := scriptSpec(t, "")
	for attempt := 1; attempt <= 2; attempt++ {
		spec.Attempt = attempt
		res, err := Exec(context.Background(), spec, Invocation{Path: "/bin/sh", Args: []string{"-c", "echo out-$0; echo err-$0 >&2", "run" + string(rune('0'+attempt))}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("attempt %d: %+v %v", attempt, res, err)
		}
	}
	out := readLog(t, spec, "stdout.log")
	errLog := readLog(t, spec, "stderr.log")
	for _, want := range []string{"=== aq job " + spec.JobID + " attempt 1: sh at ", "out-run1", "=== aq job " + spec.JobID + " attempt 2: sh at ", "out-run2"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout.log lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "out-run1") > strings.Index(out, "attempt 2") {
		t.Error("the second run did not append after the first")
	}
	if !strings.Contains(errLog, "err-run1") || !strings.Contains(errLog, "err-run2") || strings.Contains(errLog, "out-run") {
		t.Errorf("stderr.log:\n%s", errLog)
	}
	if fi, err := os.Stat(filepath.Join(spec.LogDir, "stdout.log")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stdout.log mode: %v %v", fi, err)
	}
}

// TestExecLogsBounded (#32): an engine's burst on stdout and stderr, 6
// times AQ_LOG_MAX, is stored bounded — the header and the head, a gap
// record, the tail ending with the burst's last line — and the verbatim
// output beyond it is gone from the disk; without the bound (before #32)
// the whole 6 MiB were stored.
func TestExecLogsBounded(t *testing.T) {
	testenv.Slow(t, "runs engine processes through their timeouts")
	spec := scriptSpec(t, "")
	spec.LogMax = 1 << 20
	burst := `i=0; while [ $i -lt 6 ]; do head -c 1048576 /dev/zero | tr '\0' x; i=$((i+1)); done; echo; echo last-line`
	if _, err := Exec(context.Background(), spec, Invocation{Path: "/bin/sh", Args: []string{"-c", burst + "; (" + burst + ") >&2"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"stdout.log", "stderr.log"} {
		out := readLog(t, spec, name)
		if len(out) > 1<<20+4096 {
			t.Errorf("%s stored %d bytes, over AQ_LOG_MAX (1 MiB)", name, len(out))
		}
		if !strings.HasPrefix(out, "=== aq job "+spec.JobID) || !strings.Contains(out, "bytes of output left out here") || !strings.HasSuffix(out, "\nlast-line\n") {
			t.Errorf("%s is not head, gap record, tail (%d bytes): %.200q … %.200q", name, len(out), out, out[max(0, len(out)-200):])
		}
		if left, _ := filepath.Glob(filepath.Join(spec.LogDir, name+".tail-*")); len(left) != 0 {
			t.Errorf("tail segments left: %q", left)
		}
	}
}

// TestExecRedacts: a secret printed in pieces, across writes and across
// stdout and stderr, never reaches the logs.
func TestExecRedacts(t *testing.T) {
	const secret = "ghp_SplitAcrossWrites0123456789"
	spec := scriptSpec(t, "")
	spec.Redactor = secrets.NewRedactor(nil, secret)
	script := `printf 'a ghp_Split'; sleep 0.05; printf 'AcrossWrites0123456789 b\n'
printf 'ghp_SplitAcrossWrites0123456789' >&2`
	if _, err := Exec(context.Background(), spec, Invocation{Path: "/bin/sh", Args: []string{"-c", script}}); err != nil {
		t.Fatal(err)
	}
	out, errLog := readLog(t, spec, "stdout.log"), readLog(t, spec, "stderr.log")
	if strings.Contains(out+errLog, "ghp_") || !strings.Contains(out, "a *** b") || !strings.Contains(errLog, "***") {
		t.Errorf("logs:\nstdout: %q\nstderr: %q", out, errLog)
	}
}

// TestExecLines: the parsers get each complete line in order, without the
// line end (CRLF too), blank lines skipped, and a last unterminated line.
func TestExecLines(t *testing.T) {
	spec := scriptSpec(t, "")
	var mu sync.Mutex
	var outLines, errLines []string
	inv := Invocation{
		Path: "/bin/sh",
		Args: []string{"-c", `printf 'one\r\ntwo\n\n   \nthr'; sleep 0.02; printf 'ee\nfour'; printf 'e1\ne2\n' >&2`},
		OnStdout: func(l []byte) {
			mu.Lock()
			outLines = append(outLines, string(l))
			mu.Unlock()
		},
		OnStderr: func(l []byte) {
			mu.Lock()
			errLines = append(errLines, string(l))
			mu.Unlock()
		},
	}
	if _, err := Exec(context.Background(), spec, inv); err != nil {
		t.Fatal(err)
	}
	if want := []string{"one", "two", "three", "four"}; !slices.Equal(outLines, want) {
		t.Errorf("stdout lines %q, want %q", outLines, want)
	}
	if want := []string{"e1", "e2"}; !slices.Equal(errLines, want) {
		t.Errorf("stderr lines %q, want %q", errLines, want)
	}
}

// TestExecCannotStart: a missing program or an unusable log dir is an error
// (the engine did not run), not a result.
func TestExecCannotStart(t *testing.T) {
	spec := scriptSpec(t, "")
	_, err := Exec(context.Background(), spec, Invocation{Path: filepath.Join(t.TempDir(), "no-such-engine")})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing program: %v", err)
	}
	_, err = Exec(context.Background(), spec, Invocation{Path: "no-such-engine-on-path-xyz"})
	if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("program not on PATH: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spec.LogDir = filepath.Join(file, "logs")
	if _, err := Exec(context.Background(), spec, Invocation{Path: "/bin/true"}); err == nil {
		t.Error("a log dir under a regular file: no error")
	}
}

// TestLineWriterLongLine: a line longer than maxLine is handed to the parser
// truncated once; the rest of that line is dropped, not handed over as if it
// were a line of its own.
func TestLineWriterLongLine(t *testing.T) {
	testenv.Slow(t, "runs engine processes through their timeouts")
	var lines []string
	w := &lineWriter{fn: func(l []byte) { lines = append(lines, string(l)) }}
	long := bytes.Repeat([]byte("a"), maxLine+100)
	w.Write(long[:maxLine/2])
	w.Write(long[maxLine/2:])
	w.Write([]byte("::aq-unavailable tail of the long line\nnext\n"))
	w.Write(bytes.Repeat([]byte("b"), maxLine+1))
	w.Write([]byte("tail\nlast"))
	w.Flush()
	if len(lines) != 4 {
		short := make([]string, len(lines))
		for i, l := range lines {
			short[i] = l[:min(len(l), 40)]
		}
		t.Fatalf("got %d lines %q, want the two truncated long lines, next and last", len(lines), short)
	}
	if len(lines[0]) != maxLine || lines[1] != "next" || len(lines[2]) != maxLine || lines[3] != "last" {
		t.Errorf("lines: %d bytes, %q, %d bytes, %q", len(lines[0]), lines[1], len(lines[2]), lines[3])
	}
}

func readLog(t *testing.T, spec Spec, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(spec.LogDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
