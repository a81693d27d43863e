//go:build linux

package chaos

// bugsFound lists the bugs chaos runs found and how each was fixed (the
// report prints them). Each has a regression test that fails without its fix.
var bugsFound = []Bug{
	{
		Title: "A failed job's lease lapsed while its /fleet/fail was retried",
		Where: "agent/fleet/jobrunner.go, agent/fleet/lease.go",
		Cause: "the lease renewer stopped when the pipeline did, before the final report; under a window of 503s on the " +
			"report path the fail was retried (correctly) for longer than the lease's time to live, the reaper took the lease " +
			"from a live, connected factory, and the fail came back 409 — the lease was freed by the reaper, not by the fail",
		Fix: "the renewer runs on its own context until the final report settles (JobLease.End); a renewal refused after " +
			"the report is not taken as a loss",
		Regression: "agent/fleet TestLeaseHeldWhileTheFinalReportIsRetried",
	},
	{
		Title: "An accepted broker job waited for its message's settlement before it started",
		Where: "agent/dispatch/receiver.go",
		Cause: "complete-on-claim completed the message before handing the job over; with the broker peer killed right " +
			"after an accept, the complete hung on the dead link for up to SettleTimeout, and meanwhile the job had no " +
			"runner: no lease renewal (it lapsed under a live factory) and no job record (a factory killed meanwhile did " +
			"not know it held the job)",
		Fix:        "hand the job to its runner first, then complete the message beside it",
		Regression: "agent/dispatch TestAcceptedJobStartsBeforeItsMessageIsSettled",
	},
	{
		Title: "A short lease was given up before its first renewal",
		Where: "agent/fleet/lease.go",
		Cause: "when the configured cadence did not fit the lease, it was cut to a third of the time to live — which, with " +
			"the 1 s stop margin and the Date header's 1 s resolution, could still land after the moment the lease counts " +
			"as lost, so a healthy lease was declared lost with 0 renewals tried (found while writing the first regression test)",
		Fix:        "the cadence is the smaller of a third of the time to live and half the room before the deadline",
		Regression: "agent/fleet TestLeaseCadenceFitsBeforeTheDeadline",
	},
	{
		Title: "A recovered orphan's lease lapsed while its /fleet/fail was retried",
		Where: "agent/daemon/recover.go",
		Cause: "start-up recovery confirmed the orphan's lease with one renewal, pushed its WIP, then sent /fleet/fail " +
			"without renewing again; under a window of 503s on the report path the fail outlived the lease, the reaper " +
			"freed it and the fail came back 409 (the same class as the first bug, in the recovery path; found by the full " +
			"run, seed 259266473103113)",
		Fix:        "recovery holds the confirmed lease (a JobLease renewer) until the orphan's report settles",
		Regression: "agent/daemon TestRecoverHoldsTheLeaseWhileTheFailIsRetried",
	},
	{
		Title: "The coordinator stub accepted a zombie's re-sent report",
		Where: "demo/coord/handlers.go",
		Cause: "a factory's building PATCH reached the stub but its answer was lost to a partition; spooled, it was re-sent " +
			"after the heal, when the reaper had already taken the lease (a new epoch). The stub matched it against the " +
			"job's last accepted report (same factory, epoch and stage) and answered 200: a stale write accepted, telling a " +
			"zombie it still held the job (found by the full run, seed 246748238488810). A real coordinator must not make " +
			"the same mistake: idempotent re-sends are keyed on the current epoch",
		Fix: "a re-send is idempotent only while its epoch is the job's current one, and a building re-send only while " +
			"the lease is still the sender's; the same for fail and release",
		Regression: "demo/coord TestReaperRequeuesKeepingCheckpoint, TestResentFailAfterReclaimIsFenced",
	},
	{
		Title: "A resumed run started from the coordinator's checkpoint while origin held a newer one",
		Where: "agent/runner/prepare.go",
		Cause: "the resume point preferred the checkpoint the coordinator recorded; a periodic checkpoint pushed to origin's " +
			"aq/wip/<id> after the last one the coordinator took (its PATCH spooled, then the host was lost) was ignored, " +
			"and the next run lost the work between the two (found by the work-lost invariant of the host-lost fault, " +
			"seed 182903220081653)",
		Fix:        "resume from origin's WIP ref when it descends from the recorded checkpoint (it can only have been moved by a lease holder's compare-and-swap)",
		Regression: "agent/runner TestResumeFromANewerPushedCheckpoint",
	},
	{
		Title: "The engine started before its supervisor",
		Where: "internal/process/process.go",
		Cause: "the supervisor that stops an engine when aq dies was started right after the engine; an aq killed in " +
			"between (found by aq selftest's kill -9 check under load) left the engine running unsupervised",
		Fix:        "start the supervisor first and tell it the engine's process group over its pipe; it also stops every process carrying the job's tag",
		Regression: "selftest pipeline.recover.engine-stopped (TestNothingLeftBehind); internal/process TestEngineDiesWithItsAQ",
	},
	{
		Title: "A preempted run's periodic checkpoint landed after the job went to another factory",
		Where: "agent/runner/checkpoint.go",
		Cause: "a periodic checkpoint was pushed on the lease as this factory last knew it; a preemption is learnt only at " +
			"the next renewal, so a push in that window landed a few ms after the new owner took the job (the 'pushes " +
			"only under a lease' invariant, seed 140004314678723 on one run; timing-dependent)",
		Fix:        "a periodic push first confirms the lease with a renewal (the local view decides only when the coordinator does not answer within 5 s)",
		Regression: "agent/runner TestPeriodicPushConfirmsTheLease",
	},
	{
		Title: "A fence learnt by the spool's drain was overwritten by the run's end",
		Where: "agent/fleet/jobrunner.go",
		Cause: "a run whose lease was lost during a partition spooled its reports; the background drain re-sent the first " +
			"one, got 409 (the job reaped and requeued), marked the record fenced and dropped the final report — then the " +
			"run's end, whose Send saw only 'spooled', wrote the record over with fenced false: a closed record with no " +
			"report and no fence (the 'no report lost' invariant, seed 264317234386329)",
		Fix:        "the run's end keeps a fence already on the record (endRecord)",
		Regression: "agent/fleet TestEndRecordKeepsAFenceTheDrainLearnt",
	},
	{
		Title: "A cancelled git left its ref lock behind",
		Where: "worktree/gcgit.go",
		Cause: "git commands were cancelled with SIGKILL; a periodic checkpoint stopped with its job (a drain that " +
			"escalated) died holding refs/heads/aq/wip/<id>.lock, and every later update of the ref — the final checkpoint, " +
			"aq gc — failed on it (the gc invariant of the reduced run, seed 223045733563934)",
		Fix:        "a cancelled git is sent SIGTERM, on which git removes its lock files; SIGKILL only after a grace",
		Regression: "worktree TestCancelledGitLeavesNoLock",
	},
	{
		Title: "A ref lock left by a git that died stopped the job's checkpoints and aq gc",
		Where: "agent/runner/checkpoint.go, worktree/reflock.go, worktree/gcgit.go",
		Cause: "a periodic checkpoint's update-ref, stopped as the engine ended, left refs/heads/aq/wip/<id>.lock with no " +
			"fault on its host (git makes the lock before it sets the handler that removes it on a signal; a host " +
			"killed mid-update leaves one too): the final checkpoint failed on it, the job shipped without its last " +
			"checkpoint, and aq gc could never delete the ref (the gc invariant, seed 140406565973930)",
		Fix: "the job's runner, which holds the job's lock, removes a lock on its own refs before the worktree is prepared " +
			"and after its periodic checkpoints stop; aq gc removes one older than a minute before it deletes the ref",
		Regression: "agent/runner TestADeadGitsRefLockStopsNothing, worktree TestDeleteRefsTakesADeadGitsLock",
	},
}
