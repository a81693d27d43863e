// Package chaos is the fleet's chaos harness: it proves, on a real
// multi-host run, what the second milestone (M2) of the coordinator team's "Fleet dispatch redesign"
// asks to verify —
// exactly-once shipping and crash recovery — and that nothing is lost on the
// way.
//
// A run builds a sandbox: five repositories with bare origins on the shared
// file system (git over file paths, so GitHub "stays reachable" while the
// coordinator does not), three or four factories — each a real `aq daemon`
// process with its own AQ_HOME and clones, in its own network namespace when
// the harness runs as root with iproute2 (else plain processes on 127.0.0.1
// behind TCP proxies) — the coordinator stub as a child process keeping its
// state in a file, and the local AMQP broker peer. It submits hundreds of
// jobs for a scripted engine that writes files, sometimes fails (exit 1) and
// sometimes hangs past its wall budget, and injects faults on a seeded
// schedule: kill -9 and restart of factories mid-job, SIGTERM drains and
// two-signal aborts, the broker peer killed and restarted, the stub
// answering 503s with added latency, a kill -9 and restart of the stub (its
// state file keeps what it acknowledged), partitions long enough for the
// reaper to take a factory's leases (the zombie case), lost hosts (every
// process of a factory killed -9 — daemon, supervisors, engines — its
// AQ_HOME and clones deleted, the factory back as a fresh host), and
// preemptions (the stub requeues a running job: epoch bumped, its factory
// fenced), and kill -9s of a factory while one of its engines runs in its
// sandbox with a straggler up. The factories run their engines in the
// sandbox this host gives them (AQ_SANDBOX=auto: full here; the engine's
// step log is in a directory every engine may write, AQ_SANDBOX_WRITABLE);
// where it is full, a quarter of the engines daemonise a straggler — a
// process that drops the job's tag and leaves its process group, which
// only the sandbox ends with its job. The factories checkpoint every second (AQ_CHECKPOINT_INTERVAL),
// and the scripted engine keeps its own step log on the shared file system
// (runs/<job>/<n>: start, part one, heartbeat, end, what it resumed from),
// against which the work lost per interruption, engines outliving their aq
// and engines run again for a delivered result are checked.
//
// When every job is terminal, it stops the factories, runs `aq gc` on each,
// and checks the invariants against the stub's state file, its audit trail
// and call log (coord.Options.OnCall), the origins' push log (a post-receive
// hook), the factories' logs, spools, job records and repositories, and
// /proc. Check is a pure function of those artifacts; Run writes the report
// (docs/RELIABILITY.md under `make chaos`).
//
// The reduced run is TestChaos (part of `go test ./...`); the full run is
// `go run ./chaos/cmd/chaos` (make chaos).
//
// The harness runs on Linux only (network namespaces, /proc); on other
// systems the package holds no code and the command says so.
package chaos
