// Package queue owns aq's local folder queue (docs/local.md, "The queue on
// disk"): jobs as files under one directory, one folder per stage, safe for
// several `aq run` processes on one host.
//
// # Layout
//
//	<dir>/.lock                  gofrs/flock; held by every mutation
//	<dir>/<stage>/<id>.md        the manifest, byte for byte as submitted
//	<dir>/<stage>/<id>.json      the sidecar: the job's queue state (State)
//	<dir>/failed/<id>.json.corrupt   an unreadable sidecar, kept for inspection
//
// Stages are job.Stages: inbox, blocked, building, review, testing, shipped,
// failed, dead_letter. Files whose names start with "." are the queue's own
// (the lock, temp files) and are never jobs.
//
// # Invariants
//
//   - The .md's location is the truth about a job's stage. A job exists exactly
//     when its .md does; only Remove (an operator's `aq job rm`) deletes a
//     manifest, and only Replace rewrites one (undo.go).
//   - Every mutation holds the queue-wide lock: an in-process mutex plus an
//     exclusive flock on <dir>/.lock, so no two goroutines or processes can
//     take the same job.
//   - A move renames the .md (atomic), then writes the new sidecar into the new
//     stage (temp file, fsync, rename, fsync dir), then removes the old one.
//     The new sidecar is marshalled before the rename, so a bad value fails
//     before anything moves.
//   - Submit writes the sidecar first and the manifest last: a job becomes
//     visible only once it is complete.
//   - Reads (Get, List, Waiting) take no lock. They tolerate a move in
//     progress: a sidecar missing beside its .md is looked for in the other
//     stages and reported at the .md's stage. When a read keeps racing with
//     moves it falls back to a shared lock for one consistent look.
//   - Repairs happen under the lock, when a mutation meets a problem (or for
//     every job, in Recover):
//     a sidecar in the wrong stage is adopted into the .md's stage (a crash
//     mid-move); a .md with no sidecar anywhere gets one from the parser
//     (WithParser) or minimal fields, and goes to failed with
//     invalid_manifest if the parser refuses it; a sidecar that is not valid
//     JSON or names another id moves the job to failed with invalid_manifest
//     and is kept as failed/<id>.json.corrupt; a readable sidecar superseded
//     by one beside its .md, or whose job has no .md at all, is removed;
//     leftover temp files are removed.
//   - Callbacks passed to Next and Recover run under the lock: they must be
//     quick (Recover's checkpoint is the exception: it holds the lock so that
//     only one process checkpoints an orphan) and must not call the Queue.
//
// # Sidecar JSON (stable field names)
//
//	id              string    job id (equals the file name)
//	title, repo, engine  string   from the manifest
//	stage           string    the stage folder the sidecar was written to
//	priority        int       100 low, 200 normal, 300 high, 400 critical, or 0..1000
//	capabilities    []string  capability tokens the factory must have
//	deps            []string  job ids that must ship first
//	depsMode        string    "all" | "any"
//	idempotencyKey  string    a second Submit with the same key is refused
//	retry           {max int, backoff duration-string}  the job's retry policy
//	attempts        int       runs started (incremented when Next takes it)
//	createdAt, updatedAt  RFC 3339 time
//	notBefore       RFC 3339 time, omitted when unset: retry backoff, or the end of a park
//	parked          string    what a parked job waits for ("claude usage limit"); omitted when not parked
//	parks           int       times the job was parked (rate or usage limit, exhausted credit)
//	startedAt, endedAt    RFC 3339 time, omitted when unset: the last run
//	host, pid       string, int   the process that took the job last
//	reason          string    job.Reason of the last failure (failed, dead_letter, inbox after a retry)
//	detail          string    one line: what happened
//	insights        object    job.Insights of the last run
//	branch, pr, checkpoint  string   job branch, PR URL, WIP checkpoint commit
//	history         [{at, from, to, reason, detail}]  one entry per stage change
//
// Fields that are empty are omitted, except id, stage, priority, retry,
// attempts, createdAt, updatedAt and history.
package queue
