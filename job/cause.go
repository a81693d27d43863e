package job

import (
	"context"
	"errors"
)

// StopError is the cause attached to a cancelled job context: it says which
// failure reason the stop stands for (timeout, budget_exceeded, fenced,
// lease_lost, interrupted). Whoever cancels a job's context cancels it with a
// StopError (context.WithCancelCause); the runner maps it back to a Reason.
type StopError struct {
	Reason Reason
	Detail string
}

func (e *StopError) Error() string {
	if e.Detail == "" {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Detail
}

// Stop returns a StopError for reason.
func Stop(reason Reason, detail string) error { return &StopError{Reason: reason, Detail: detail} }

// StopReason reports why ctx was stopped: the StopError cause if there is one,
// else interrupted (a plain cancellation comes from aq being asked to stop).
// ok is false while ctx is live.
func StopReason(ctx context.Context) (r Reason, detail string, ok bool) {
	if ctx.Err() == nil {
		return "", "", false
	}
	var se *StopError
	if errors.As(context.Cause(ctx), &se) {
		return se.Reason, se.Detail, true
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ReasonTimeout, "deadline exceeded", true
	}
	return ReasonInterrupted, "aq was asked to stop", true
}
