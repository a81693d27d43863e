package fleet

import (
	"errors"
	"fmt"
	"net/http"
)

// FencedError is a 409 on a fenced call: this factory no longer owns the job
// (its lease epoch is stale, the job was requeued or reaped), or, on accept,
// another factory owns it. Nothing more may be reported for the job.
type FencedError struct {
	Call   string // e.g. "PATCH /fleet/jobs/:id"
	JobID  string
	Epoch  int64
	Detail string // the coordinator's reason, redacted
}

// Conflict reports a 409 (the broker receiver's predicate: complete the
// message, the job is owned elsewhere).
func (e *FencedError) Conflict() bool { return true }

func (e *FencedError) Error() string {
	msg := fmt.Sprintf("job %s is fenced: the coordinator answered 409 to %s (epoch %d); another factory owns it now", e.JobID, e.Call, e.Epoch)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// AuthError is a 401 or 403: the coordinator refused this factory's
// credentials. Retrying cannot help; an operator must fix the token.
type AuthError struct {
	Call   string
	Status int
	Detail string
}

func (e *AuthError) Error() string {
	msg := fmt.Sprintf("the coordinator refused this factory's credentials (%d %s on %s)", e.Status, http.StatusText(e.Status), e.Call)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Fix says what an operator can do about it.
func (e *AuthError) Fix() string {
	return "check AQ_FLEET_TOKEN; if this factory's token was revoked or rotated, remove $AQ_HOME/credentials and start again with a new enrollment token in AQ_FLEET_TOKEN"
}

// ErrGone is a 404 for a job: the coordinator no longer has it. It answers
// Gone() (the broker receiver's predicate); match it with errors.Is.
var ErrGone error = goneError{}

type goneError struct{}

func (goneError) Error() string { return "the coordinator no longer has this job (404)" }

// Gone reports a 404.
func (goneError) Gone() bool { return true }

// StatusError is any other 4xx answer: the request itself is wrong, so it is
// never retried.
type StatusError struct {
	Call   string
	Status int
	Detail string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("the coordinator refused %s: %d %s", e.Call, e.Status, http.StatusText(e.Status))
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// TransientError is a call that did not succeed within its retry budget for
// a reason that can pass (network error, timeout, 429, 5xx). The caller may
// try again later (the report spool does).
type TransientError struct {
	Call   string
	Status int   // the last HTTP status; 0 for a network error
	Tries  int   // attempts made
	Err    error // the last network error, if any
	Detail string
}

func (e *TransientError) Error() string {
	var what string
	switch {
	case e.Status != 0:
		what = fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
		if e.Detail != "" {
			what += ": " + e.Detail
		}
	case e.Err != nil:
		what = e.Err.Error()
	default:
		what = "no answer"
	}
	return fmt.Sprintf("coordinator unavailable for %s after %d attempt(s): %s", e.Call, e.Tries, what)
}

func (e *TransientError) Unwrap() error { return e.Err }

// Temporary reports a failure that may pass (the broker receiver's
// predicate: abandon the message, it is redelivered).
func (e *TransientError) Temporary() bool { return true }

// IsTransient reports whether err is a failure that may pass on its own.
func IsTransient(err error) bool {
	var te *TransientError
	return errors.As(err, &te)
}

// IsFenced reports whether err says this factory no longer owns the job.
func IsFenced(err error) bool {
	var fe *FencedError
	return errors.As(err, &fe)
}

// IsAuth reports whether err is the coordinator refusing the credentials.
func IsAuth(err error) bool {
	var ae *AuthError
	return errors.As(err, &ae)
}

// MissingRouteError is a 404 or 405 on a route an older or smaller
// coordinator may not have (GET /fleet/factories, the artifacts, a job's
// events): the caller shows or does what it can without it.
type MissingRouteError struct {
	Call   string // e.g. "GET /fleet/factories"
	Status int
}

func (e *MissingRouteError) Error() string {
	return fmt.Sprintf("the coordinator has no %s (it answered %d %s)", e.Call, e.Status, http.StatusText(e.Status))
}

// IsMissingRoute reports whether err is a *MissingRouteError.
func IsMissingRoute(err error) bool {
	var me *MissingRouteError
	return errors.As(err, &me)
}
