package engines

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/boundlog"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
)

// Invocation is one engine command line.
type Invocation struct {
	Path  string
	Args  []string
	Stdin io.Reader // nil: stdin is closed at once
	// OnStdout is called with each complete stdout line (without the
	// newline), in order, while the engine runs.
	OnStdout func(line []byte)
	// OnStderr likewise for stderr (e.g. to spot "OAuth token expired").
	OnStderr func(line []byte)
}

// maxLine bounds one parsed output line; longer lines are still logged in full
// but handed to the parser truncated (engines print tool results on one line).
const maxLine = 16 << 20

// Exec runs an engine command the one way aq runs engines: in its own process
// group, with spec.Env plus the AQ_JOB_ID tag, in spec.Dir, stdout and stderr
// appended to spec.LogDir/{stdout,stderr}.log through the redactor and handed
// line by line to the parsers, stopped through the kill ladder when ctx ends.
func Exec(ctx context.Context, spec Spec, inv Invocation) (process.Result, error) {
	if err := os.MkdirAll(spec.LogDir, 0o700); err != nil {
		return process.Result{}, fmt.Errorf("create job log dir: %w", err)
	}
	outF, err := openLog(filepath.Join(spec.LogDir, "stdout.log"), spec.LogMax)
	if err != nil {
		return process.Result{}, err
	}
	defer outF.Close()
	errF, err := openLog(filepath.Join(spec.LogDir, "stderr.log"), spec.LogMax)
	if err != nil {
		return process.Result{}, err
	}
	defer errF.Close()
	header := Header(spec, filepath.Base(inv.Path), time.Now())
	_, _ = io.WriteString(outF, header) // a log header: the engine runs whether or not it is written
	_, _ = io.WriteString(errF, header)

	outLog := secrets.NewWriter(outF, spec.Redactor)
	errLog := secrets.NewWriter(errF, spec.Redactor)
	outLines := &lineWriter{fn: inv.OnStdout}
	errLines := &lineWriter{fn: inv.OnStderr}
	res, runErr := process.Run(ctx, process.Spec{
		Path:   inv.Path,
		Args:   inv.Args,
		Dir:    spec.Dir,
		Env:    spec.Env,
		Stdin:  inv.Stdin,
		Stdout: io.MultiWriter(outLog, outLines),
		Stderr: io.MultiWriter(errLog, errLines),
		Tag:    spec.JobID,
		Scope:  spec.Scope,
		Grace:  spec.Grace,

		Supervisor: spec.Supervisor,
		Jail:       spec.Jail,
	})
	outLines.Flush()
	errLines.Flush()
	outLog.Flush()
	errLog.Flush()
	return res, runErr
}

// Header is the line Exec writes before each run in stdout.log and
// stderr.log: the job, the attempt (and the repair round), what ran and
// when. Transcript and IsHeader read it back.
func Header(spec Spec, what string, at time.Time) string {
	round := ""
	if spec.Round > 0 {
		round = fmt.Sprintf(" repair %d/%d", spec.Round, max(spec.Rounds, spec.Round))
	}
	return fmt.Sprintf("=== aq job %s attempt %d%s: %s at %s ===\n", spec.JobID, spec.Attempt, round, what, at.UTC().Format(time.RFC3339))
}

// openLog opens a job log for appending, bounded to max bytes of this
// run's output (boundlog).
func openLog(path string, max int64) (*boundlog.File, error) {
	f, err := boundlog.Open(path, max)
	if err != nil {
		return nil, fmt.Errorf("open job log: %w", err)
	}
	return f, nil
}

// lineWriter calls fn with each complete line written to it.
type lineWriter struct {
	mu  sync.Mutex
	fn  func([]byte)
	buf []byte
	// dropping: a line over maxLine was handed over truncated; the rest of
	// it, up to its newline, is not a line of its own and is dropped.
	dropping bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	if w.fn == nil {
		return len(p), nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if w.dropping {
			w.dropping = false
		} else {
			w.emit(w.buf[:i])
		}
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLine {
		// Keep memory bounded: hand over what we have, drop the rest of the line.
		if !w.dropping {
			w.emit(w.buf[:maxLine])
		}
		w.buf = w.buf[:0]
		w.dropping = true
	}
	if len(w.buf) == 0 {
		w.buf = nil // release a large backing array
	}
	return len(p), nil
}

func (w *lineWriter) emit(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	cp := make([]byte, len(line))
	copy(cp, line)
	w.fn(cp)
}

// Flush hands over a final unterminated line.
func (w *lineWriter) Flush() {
	if w.fn == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 && !w.dropping {
		w.emit(w.buf)
	}
	w.buf, w.dropping = nil, false
}
