package runner

import (
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/job"
)

// Event is one step of a running job, handed to Options.OnEvent: one of the
// types below. A consumer switches on the type and lets the others pass:
//
//	switch e := e.(type) {
//	case runner.EngineStarted: …
//	case runner.Delivered: …
//	}
//
// Adding one: declare its type here with the event marker, emit it with
// ru.event where it happens, and add a case where it matters (the fleet's
// recorder, the daemon's phases, the CLI's progress line). Nothing else
// needs to change: every consumer ignores what it does not know.
type Event interface{ event() }

// Preparing: the runner has the job; pre-flight, the repo lock and the
// worktree come next.
type Preparing struct{}

// EngineStarted: the worktree is ready and the engine starts.
type EngineStarted struct{ Engine string }

// Progress is the engine's usage so far (tokens, cost, turns), as its meter
// reads it.
type Progress struct {
	Engine string
	Usage  engines.Usage
}

// Checkpointed: a WIP checkpoint was taken (a periodic one while the engine
// runs, or the one after it), in the worktree's repository.
type Checkpointed struct{ Checkpoint string }

// CheckpointPushed: a periodic checkpoint is on origin's aq/wip/<id> (a fleet
// job records it with the coordinator, so the next owner resumes from it).
type CheckpointPushed struct{ Checkpoint string }

// Verified: the job's verify: command ran after the engine's run Round
// (0: the attempt's first run, k: repair round k), with Result.
type Verified struct {
	Round  int
	Result job.VerifyResult
}

// VerifyStarted: the job's verify: command starts after the engine's run
// Round (0: the attempt's first run, k: repair round k).
type VerifyStarted struct {
	Round   int
	Command string
}

// Shipping: the result is committed and verified; the job is being
// delivered per its ship: (a branch pushed, a PR opened, a merge).
type Shipping struct{ Ship string }

// RepairStarted: verify failed (Verify) and the engine runs again, in the
// same worktree and attempt, with the failure in hand: repair round Round
// of Of. Session is the engine session it is asked to continue ("": none,
// it starts fresh).
type RepairStarted struct {
	Round, Of       int
	Engine, Session string
	Verify          job.VerifyResult
}

// Delivered: the job's result commit is on origin's job branch — this run's,
// or an earlier attempt's found there. Recorded before the report: a crash
// from here on must not run the engine again.
type Delivered struct{ Branch, Commit string }

// EgressRefused: the job's egress proxy refused its sandboxed engine a
// connection to a destination for the first time (the outcome's insights
// count them all: Insights.EgressRefused).
type EgressRefused struct{ Refusal job.EgressRefusal }

// UntrustedFileRefused: aq refused a file the engine could have written
// (a symbolic link, a FIFO, a device, an oversized file where it expected
// a regular file: internal/safefs); the outcome's insights list them
// (Insights.UntrustedFiles).
type UntrustedFileRefused struct{ File job.UntrustedFile }

func (Preparing) event()            {}
func (EngineStarted) event()        {}
func (Progress) event()             {}
func (Checkpointed) event()         {}
func (CheckpointPushed) event()     {}
func (Delivered) event()            {}
func (Verified) event()             {}
func (RepairStarted) event()        {}
func (EgressRefused) event()        {}
func (UntrustedFileRefused) event() {}
func (VerifyStarted) event()        {}
func (Shipping) event()             {}
