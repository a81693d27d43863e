package job

import "time"

// Stage is where a job is in its life (docs/local.md, "The queue on disk"). Local stage folders use
// these names; the coordinator calls Inbox "queued".
type Stage string

const (
	Inbox      Stage = "inbox"
	Blocked    Stage = "blocked"
	Building   Stage = "building"
	Review     Stage = "review"  // PR open
	Testing    Stage = "testing" // verify passed
	Shipped    Stage = "shipped"
	Failed     Stage = "failed"
	DeadLetter Stage = "dead_letter"
)

// Stages in board order.
var Stages = []Stage{Inbox, Blocked, Building, Review, Testing, Shipped, Failed, DeadLetter}

// Terminal reports whether a job in s is done for good (unless an operator
// requeues it).
func (s Stage) Terminal() bool { return s == Shipped || s == DeadLetter }

// FleetName is the coordinator's name for s.
func (s Stage) FleetName() string {
	if s == Inbox {
		return "queued"
	}
	return string(s)
}

// StageFromFleet maps a coordinator stage to a local one ("assigned" counts as
// building: a factory holds it).
func StageFromFleet(s string) Stage {
	switch s {
	case "queued":
		return Inbox
	case "assigned":
		return Building
	}
	return Stage(s)
}

// Reason says why a job failed (docs/troubleshooting.md, "Failure reasons").
type Reason string

const (
	ReasonTimeout            Reason = "timeout"
	ReasonBudgetExceeded     Reason = "budget_exceeded"
	ReasonCrash              Reason = "crash"
	ReasonVerifyFailed       Reason = "verify_failed"
	ReasonCapabilityMismatch Reason = "capability_mismatch"
	ReasonNoEngine           Reason = "no_engine"
	ReasonEngineFailed       Reason = "engine_failed"
	ReasonEngineUnavailable  Reason = "engine_unavailable"
	ReasonRepoUnavailable    Reason = "repo_unavailable"
	ReasonFenced             Reason = "fenced"
	ReasonLeaseLost          Reason = "lease_lost"
	ReasonInvalidManifest    Reason = "invalid_manifest"
	// ReasonInterrupted: aq itself was asked to stop (SIGINT/SIGTERM) while the
	// job ran: neither the task's fault nor a crash, so a reason of its own
	// rather than one of those.
	ReasonInterrupted Reason = "interrupted"
	// ReasonShipFailed: the work is committed and checkpointed but could not
	// be pushed or its PR opened (network, auth, branch protection).
	ReasonShipFailed Reason = "ship_failed"
	// ReasonRejected: an operator rejected the job (aq job reject).
	ReasonRejected Reason = "rejected"
	// ReasonRateLimited: the engine's account hit a rate or usage limit or
	// ran out of credit. Not a failure: the job is parked until the limit
	// resets (ParkUntil), and the attempt does not count against its
	// retries. Expired or missing logins stay engine_unavailable.
	ReasonRateLimited Reason = "rate_limited"
	// ReasonInvalidJob: a job from the coordinator that this factory refused
	// before acting on it: its id or repo is not valid, disagrees with its
	// manifest's, or names a repository by URL or path (fleet mode takes a
	// name). Permanent. A manifest that does not parse stays
	// invalid_manifest: that is its author's to fix, as locally.
	ReasonInvalidJob Reason = "invalid_job"
	// ReasonHostUnavailable: this host could not run the job — $AQ_HOME's
	// file system is full, read-only or failing. Not the job's fault: it is
	// released for another factory (fleet) or goes back to the queue.
	ReasonHostUnavailable Reason = "host_unavailable"
	// ReasonReportRefused: the coordinator refused a report of the job's
	// that the job cannot go on without (the building report) with a 4xx
	// other than 409, or answered it with something that is not the
	// contract's JSON: the job was stopped before its engine.
	ReasonReportRefused Reason = "report_refused"
	// ReasonSandboxUnavailable: the job's sandbox could not be made — the
	// host cannot sandbox under AQ_SANDBOX=on, or the sandbox failed to
	// start. Not the task's fault: retried, elsewhere in a fleet; the
	// worktree and branch are intact (docs/sandbox.md).
	ReasonSandboxUnavailable Reason = "sandbox_unavailable"
	// ReasonOutOfMemory: the kernel killed the engine or verify for
	// memory at the job's sandbox limit (AQ_SANDBOX_MEMORY). Counted
	// against the job's retries, like a timeout.
	ReasonOutOfMemory Reason = "out_of_memory"
	// ReasonDiskExceeded: what the job's run wrote (its worktree's growth,
	// its home, tmp and cache overlays) passed its disk budget (budget.disk,
	// AQ_JOB_DISK_MAX), or would have taken the host's free space below
	// AQ_DISK_RESERVE: the engine was stopped, its files removed, no
	// checkpoint taken of the oversized tree. Counted against the job's
	// retries, like out_of_memory.
	ReasonDiskExceeded Reason = "disk_exceeded"
	// ReasonSecretInChange: the change held a secret this factory holds
	// (the engine's login or API key, the factory token, a GH token, a
	// value the redactor masks) — in plain, base64 or URL-encoded form.
	// Nothing of it was pushed; the worktree and the WIP checkpoint stay on
	// the host for an operator. Permanent: a retry resumes from the same
	// checkpoint; `aq job requeue` after a person has looked
	// (docs/sandbox.md, "What ships is checked").
	ReasonSecretInChange Reason = "secret_in_change"
	// ReasonProtectedChange: the change touched a protected path (CI or
	// ownership configuration: AQ_PROTECTED_PATHS) its manifest's
	// may_change does not name. Nothing of it was pushed: pushing the
	// branch alone runs a repository's `on: push` workflows. Permanent,
	// like secret_in_change.
	ReasonProtectedChange Reason = "protected_change"
)

// Reasons is every failure reason.
var Reasons = []Reason{ReasonTimeout, ReasonBudgetExceeded, ReasonCrash, ReasonVerifyFailed, ReasonCapabilityMismatch,
	ReasonNoEngine, ReasonEngineFailed, ReasonEngineUnavailable, ReasonRepoUnavailable, ReasonFenced, ReasonLeaseLost,
	ReasonInvalidManifest, ReasonInterrupted, ReasonShipFailed, ReasonRejected, ReasonRateLimited,
	ReasonInvalidJob, ReasonHostUnavailable, ReasonReportRefused, ReasonSandboxUnavailable, ReasonOutOfMemory,
	ReasonDiskExceeded, ReasonSecretInChange, ReasonProtectedChange}

// Infrastructure reports whether r is not the task's fault (auth expired,
// usage limit, aq stopped, lease lost, aq crashed): such failures are retried
// even when the job's retry budget is spent, up to InfraRetries more times.
func (r Reason) Infrastructure() bool {
	switch r {
	case ReasonEngineUnavailable, ReasonInterrupted, ReasonLeaseLost, ReasonCrash, ReasonShipFailed, ReasonSandboxUnavailable,
		ReasonHostUnavailable, ReasonReportRefused:
		return true
	}
	return false
}

// Permanent reports whether retrying cannot help: the manifest is bad,
// another factory owns the job, or what the change holds needs a person
// (a secret, a protected path: a retry would resume from the same
// checkpoint and be refused again).
func (r Reason) Permanent() bool {
	switch r {
	case ReasonInvalidManifest, ReasonInvalidJob, ReasonFenced, ReasonRejected, ReasonSecretInChange, ReasonProtectedChange:
		return true
	}
	return false
}

// Parks reports whether r parks the job until a time rather than failing
// it: the run does not count as an attempt and the job's retries are not
// spent.
func (r Reason) Parks() bool { return r == ReasonRateLimited }

// Parking defaults (DefaultParkWait is documented in docs/engines.md).
const (
	// DefaultParkWait is how long a job parks when the engine named no
	// reset time, or one aq could not read or believe.
	DefaultParkWait = 15 * time.Minute
	// MinParkWait is how long a job parks when the reset the engine named
	// has already passed (clocks that disagree; a limit that has just
	// lifted): a short wait, never a tight loop.
	MinParkWait = time.Minute
	// MaxParkWait bounds a reset time aq believes: the longest limits
	// (a monthly spend cap) reset within a month.
	MaxParkWait = 31 * 24 * time.Hour
)

// ParkUntil is when a job parked at now by a limit that resets at reset
// (zero: unknown) may run again: reset itself when it lies within
// MaxParkWait; now+MinParkWait when it has passed; now+DefaultParkWait when
// it is unknown or too far off. note says which rule replaced reset ("" when
// reset was taken as it is).
func ParkUntil(now, reset time.Time) (until time.Time, note string) {
	switch {
	case reset.IsZero():
		return now.Add(DefaultParkWait), "no reset time reported: parked for the default " + DefaultParkWait.String()
	case !reset.After(now):
		return now.Add(MinParkWait), "the reported reset " + reset.UTC().Format(time.RFC3339) + " has passed: parked for " + MinParkWait.String()
	case reset.Sub(now) > MaxParkWait:
		return now.Add(DefaultParkWait), "the reported reset " + reset.UTC().Format(time.RFC3339) + " is more than " + MaxParkWait.String() + " away: parked for the default " + DefaultParkWait.String()
	}
	return reset, ""
}

// InfraRetries is how many extra attempts infrastructure failures get beyond
// a job's retry.max, so an expired login does not burn the task's retries but
// cannot loop forever either.
const InfraRetries = 3

// Retryable decides whether a job that failed with r after attempts runs
// (attempts counts the run that just failed) goes back to the queue.
func Retryable(r Reason, attempts int, policy Retry) bool {
	if r.Permanent() {
		return false
	}
	if r.Parks() {
		return true // not an attempt: nothing is spent
	}
	limit := policy.Max
	if r.Infrastructure() {
		limit += InfraRetries
	}
	return attempts <= limit
}

// Backoff is the wait before attempt+1: the policy's backoff doubled per
// earlier attempt, capped at one hour; infrastructure failures wait at least
// 30 s so a dead login is not hammered. An interrupted job (aq was stopped)
// may run again at once.
func Backoff(r Reason, attempts int, policy Retry) time.Duration {
	if r == ReasonInterrupted {
		return 0
	}
	base := policy.Backoff.D()
	if base <= 0 {
		base = DefaultBackoff
	}
	d := base
	for i := 1; i < attempts && d < time.Hour; i++ {
		d *= 2
	}
	if d > time.Hour {
		d = time.Hour
	}
	if r.Infrastructure() && d < 30*time.Second {
		d = 30 * time.Second
	}
	return d
}

// Insights are what a run reports: engine usage, cost and the size of the
// change (docs/architecture.md, "Running a job": the report).
type Insights struct {
	Engine        string  `json:"engine,omitempty"`
	EngineVersion string  `json:"engineVersion,omitempty"`
	Model         string  `json:"model,omitempty"`
	SessionID     string  `json:"sessionId,omitempty"`
	Subtype       string  `json:"subtype,omitempty"`
	TokensIn      int64   `json:"tokensIn"`
	TokensOut     int64   `json:"tokensOut"`
	TokensCached  int64   `json:"tokensCached"`
	CostUSD       float64 `json:"costUsd"`
	CostEstimated bool    `json:"costEstimated,omitempty"` // metered from a price table, not reported by the engine
	Turns         int     `json:"turns"`
	WallMS        int64   `json:"wallMs"`
	FilesChanged  int     `json:"filesChanged"`
	LinesAdded    int     `json:"linesAdded"`
	LinesDeleted  int     `json:"linesDeleted"`
	ExitCode      int     `json:"exitCode"`

	// Repair rounds (docs/engines.md, "Repair rounds"). The usage above is
	// the attempt's: every run of the engine summed.
	//
	// Runs are the engine's runs of a job with a verify: command, the
	// first and each repair round, with what each spent and what verify
	// said after it.
	Runs []Run `json:"runs,omitempty"`
	// RepairRounds is how many repair rounds ran after a failed verify.
	RepairRounds int `json:"repairRounds,omitempty"`
	// Verify is the attempt's last verify (with the tail of its output when
	// it failed): what the next attempt is told.
	Verify *VerifyResult `json:"verify,omitempty"`
	// EgressRefused are the destinations the job's egress proxy refused
	// to its sandboxed engine, most refused first (docs/sandbox.md,
	// "Network"): what an operator may want to allow in AQ_SANDBOX_NET.
	EgressRefused []EgressRefusal `json:"egressRefused,omitempty"`
	// UntrustedFiles are the files aq refused to read or write in the
	// trees the engine could write (docs/sandbox.md, "What aq reads from
	// the engine's trees"): a symbolic link, a FIFO, a device or an
	// oversized file where aq expected a regular file. At most
	// MaxUntrustedFiles, the first refused first.
	UntrustedFiles []UntrustedFile `json:"untrustedFiles,omitempty"`
	// ProtectedChanged are the protected paths (AQ_PROTECTED_PATHS) the
	// change touches that the manifest's may_change allowed: with them,
	// ship: merge opens the PR without enabling auto-merge
	// (docs/sandbox.md, "What ships is checked").
	ProtectedChanged []string `json:"protectedChanged,omitempty"`
}

// UntrustedFile is one file aq refused in an engine's tree: the tree
// ("worktree", "home", "state", "tmp"), the path relative to it, and what
// was found there.
type UntrustedFile struct {
	Tree string `json:"tree"`
	Path string `json:"path"`
	Why  string `json:"why"`
}

// MaxUntrustedFiles bounds Insights.UntrustedFiles.
const MaxUntrustedFiles = 20

// EgressRefusal is one destination a job's egress proxy refused: how many
// connections, and why (the rule that refused it, and how to allow it).
type EgressRefusal struct {
	Host  string `json:"host"`
	Port  int    `json:"port"`
	Count int    `json:"count"`
	Why   string `json:"why,omitempty"`
}

// MaxEgressRefusals bounds Insights.EgressRefused: the destinations refused
// most are kept.
const MaxEgressRefusals = 20
