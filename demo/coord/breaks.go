package coord

import (
	"fmt"
	"slices"
	"strings"
)

// Breaks: rules of the contract (docs/contract.md) the stub can be told to
// break, one each (Options.Breaks, `aq demo coordinator --break`). They are
// test and demo options: each makes the stub behave as a coordinator with
// that one bug would, so that `aq fleet check` can be shown to catch it.
const (
	// BreakStaleEpoch: a write (PATCH, renew, release, fail) carrying a
	// stale lease epoch is taken as the holder's — a zombie factory's
	// report overwrites the job.
	BreakStaleEpoch = "stale-epoch"
	// BreakDropCheckpoint: a building PATCH that repeats the last one but
	// carries a new checkpoint is answered 200 as a re-send and the
	// checkpoint dropped — the next factory resumes from an older one.
	BreakDropCheckpoint = "drop-checkpoint"
	// BreakResendConflict: a re-sent report (the same PATCH or fail again,
	// its first answer lost) is refused 409 once the first one ended the
	// lease, instead of being answered as the report it repeats.
	BreakResendConflict = "resend-conflict"
	// BreakIgnoreNotBefore: a park (/fleet/fail with reason rate_limited
	// and notBefore) is taken as any retryable failure: the job is queued
	// at once and the attempt counted.
	BreakIgnoreNotBefore = "ignore-not-before"
	// BreakDoubleLease: POST /fleet/accept hands out a job that a factory
	// holds — two factories then run it.
	BreakDoubleLease = "double-lease"
	// BreakFrozenVersion: GET /fleet/queue-state answers the same version
	// whatever changes — a gated factory never claims.
	BreakFrozenVersion = "frozen-version"
	// BreakLogStaleEpoch: a live log chunk carrying a stale lease epoch is
	// appended — a fenced factory's output lands in the job's live log.
	BreakLogStaleEpoch = "log-stale-epoch"
)

// AllBreaks lists the breaks the stub knows, in the order of the contract.
var AllBreaks = []string{BreakFrozenVersion, BreakDoubleLease, BreakStaleEpoch, BreakResendConflict, BreakDropCheckpoint, BreakIgnoreNotBefore, BreakLogStaleEpoch}

// checkBreaks validates Options.Breaks.
func checkBreaks(o *Options) error {
	for _, b := range o.Breaks {
		if !slices.Contains(AllBreaks, b) {
			return fmt.Errorf("unknown break %q (one of %s)", b, strings.Join(AllBreaks, ", "))
		}
	}
	return nil
}

// broken reports whether the stub was told to break rule b.
func (s *Server) broken(b string) bool { return slices.Contains(s.o.Breaks, b) }
