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

// ContractError is a 2xx answer that is not the contract's JSON: a login
// page a proxy put in front of the coordinator, a truncated or garbled
// body, an answer over the size cap, or one without what the call must
// return (a claim's job, enroll's token). Retrying cannot help: AQ_FLEET_API
// does not reach the coordinator's API, or the coordinator does not speak
// the contract (docs/troubleshooting.md). Before any job ran it is a
// configuration error (exit 2); for a job's report, the report is refused
// (kept in spool/dead).
type ContractError struct {
	Call        string
	Status      int
	ContentType string // the answer's, as sent ("" when none)
	// Cap is the size cap the answer was over (0: not over it).
	Cap    int64
	Detail string // what is wrong with it, redacted
}

func (e *ContractError) Error() string {
	ct := e.ContentType
	if ct == "" {
		ct = "no Content-Type"
	}
	if e.Cap > 0 {
		return fmt.Sprintf("the coordinator's answer to %s (%d %s, %s) is over the %s cap on an answer", e.Call, e.Status, http.StatusText(e.Status), ct, sizeText(e.Cap))
	}
	msg := fmt.Sprintf("the coordinator's answer to %s (%d %s, %s) is not the contract's JSON", e.Call, e.Status, http.StatusText(e.Status), ct)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Fix says what an operator can do about it.
func (e *ContractError) Fix() string {
	return "check AQ_FLEET_API: it is the coordinator's API base, e.g. https://host/api, reached without a proxy's login page in between"
}

// sizeText is n bytes in words (8 MiB).
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d byte", n)
}

// IsContract reports whether err is an answer that is not the contract's.
func IsContract(err error) bool {
	var ce *ContractError
	return errors.As(err, &ce)
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
