// Package fleet is aq's side of the fleet contract (docs/contract.md; the daemon's side in docs/daemon.md): the
// coordinator client (go-retryablehttp with a retry budget per call),
// enrollment and the credentials file, the heartbeat loop, the poll path with
// the queue-state gate and idle backoff, lease renewal that cancels a job's
// context when the lease is fenced or lost, fenced stage reports, /fleet/fail,
// the report spool that re-sends what the coordinator could not take, shadow
// mode, and the JobRunner that takes one claimed job through runner.Runner
// end to end.
//
// Every goroutine here is owned by a context and a WaitGroup of its caller:
// a daemon can own the pieces (Heartbeater, Poller, Reporter's drain loop,
// JobRunner) and stop them all without one outliving it.
//
// The factory token never reaches a log line, an error, argv or an engine's
// environment: the client keeps it in memory (and in the 0600 credentials
// file), errors carry only redacted server text.
package fleet
