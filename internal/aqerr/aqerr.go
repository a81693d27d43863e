// Package aqerr owns aq's user-facing error type and the mapping from errors to
// process exit codes (README.md, "Exit codes"). Commands and packages return *Error values (or
// wrap them); only cmd/aq prints them and turns them into an exit status, once.
package aqerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/aqfleet/aq/internal/brief"
)

// Code is a process exit status with a documented meaning.
type Code int

// Exit codes of aq (README.md, "Exit codes"). They are part of the contract: scripts and
// systemd units depend on them.
const (
	OK       Code = 0 // a job ran and succeeded (or the command did its work)
	Failed   Code = 1 // a job ran and failed, or a command failed at run time
	Usage    Code = 2 // usage or configuration error: nothing was done
	NoJob    Code = 3 // no runnable job
	Fenced   Code = 4 // the job was fenced (quarantined): another factory owns it
	AuthFail Code = 5 // the coordinator refused this factory's credentials (401/403)
	// ReportRefused: a job ran (or was stopped before its engine), but the
	// coordinator refused its report — a 4xx other than 409, or an answer
	// that is not the contract's JSON: the coordinator does not have the
	// job's outcome; the report is kept in $AQ_HOME/spool/dead.
	ReportRefused Code = 6
)

// String names the code for logs and docs.
func (c Code) String() string {
	switch c {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Usage:
		return "usage"
	case NoJob:
		return "no_job"
	case Fenced:
		return "fenced"
	case AuthFail:
		return "auth"
	case ReportRefused:
		return "report_refused"
	}
	return fmt.Sprintf("code(%d)", int(c))
}

// Error is an error meant for a person: what is wrong, and how to fix it.
type Error struct {
	Code Code
	// What says what is wrong, in one line, without a trailing period.
	What string
	// Fix says how to fix it; empty when there is nothing the user can do.
	Fix string
	// Err is the underlying cause, kept for errors.Is/As; it is not printed
	// separately (What should already say what matters).
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.What)
	if e.Fix != "" {
		b.WriteString(" (")
		b.WriteString(e.Fix)
		b.WriteString(")")
	}
	return brief.OneLine(b.String(), 0)
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an *Error with the given code.
func New(code Code, what, fix string) *Error {
	return &Error{Code: code, What: what, Fix: fix}
}

// Wrap returns an *Error with the given code that keeps err as its cause.
func Wrap(code Code, err error, what, fix string) *Error {
	return &Error{Code: code, What: what, Fix: fix, Err: err}
}

// Usagef is a usage/configuration error (exit 2).
func Usagef(fix, format string, args ...any) *Error {
	return &Error{Code: Usage, What: fmt.Sprintf(format, args...), Fix: fix}
}

// Silent is an error whose message has already been shown to the user (for
// example by `aq validate`, which prints one line per bad file); main only maps
// it to its exit code.
type Silent struct{ Code Code }

func (s *Silent) Error() string { return "exit " + s.Code.String() }

// ExitCode maps any error to the exit code main should use. nil is OK; errors
// that carry no code are Failed.
func ExitCode(err error) Code {
	if err == nil {
		return OK
	}
	var s *Silent
	if errors.As(err, &s) {
		return s.Code
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Failed
}

// IsSilent reports whether err has already been shown to the user.
func IsSilent(err error) bool {
	var s *Silent
	return errors.As(err, &s)
}

// Message renders err as the single line main prints to stderr.
func Message(err error) string {
	return brief.OneLine(err.Error(), 0)
}
