package fleetcheck

import "github.com/aqfleet/aq/agent/fleet"

// Verdict is what the check found for one route or rule.
type Verdict string

// Verdicts.
const (
	// Present: the route answered as the contract says; the rule holds.
	Present Verdict = "present"
	// Missing: the coordinator lacks the route (404/405 naming it), or
	// does not do what the rule asks in a way aq copes with: aq falls back
	// (Row.AQ says how).
	Missing Verdict = "missing"
	// Wrong: the coordinator answers against the contract in a way aq
	// cannot make up for, or lacks a route aq cannot work without.
	Wrong Verdict = "wrong"
	// Unchecked: the check could not get there (an earlier step failed,
	// or the route it needs is missing).
	Unchecked Verdict = "not checked"
)

// Sections of docs/contract.md, in its order: each row belongs to one.
const (
	SecRequests = "Requests, retries and errors"
	SecEnroll   = "Enrollment and heartbeats"
	SecClaim    = "Claiming and accepting a job"
	SecLease    = "Leases and fencing"
	SecReports  = "Stage reports"
	SecFail     = "Failing a job"
	SecSpool    = "The report spool"
	SecArtifact = "Artifacts"
	SecLogs     = "Live logs"
	SecSubmit   = "Submitting jobs and operator actions"
	SecBroker   = "Broker messages"
	SecNoRoute  = "Without a route: fallbacks"
)

// Sections lists the titles of docs/contract.md's sections, in order.
var Sections = []string{SecRequests, SecEnroll, SecClaim, SecLease, SecReports, SecFail, SecSpool, SecArtifact, SecLogs, SecSubmit, SecBroker, SecNoRoute}

// Rule ids: the rows that are rules rather than routes.
const (
	RuleUnknownRoute   = "unknown-route"
	RuleUnknownJob     = "unknown-job"
	RuleDateHeader     = "date-header"
	RuleVersionMoves   = "version-moves"
	RuleVersionDue     = "version-due"
	RuleAcceptHeld     = "accept-held"
	RulePrevious       = "previous"
	RuleStaleEpoch     = "stale-epoch"
	RuleTerminalEnds   = "terminal-ends-lease"
	RuleResend         = "resend"
	RuleCheckpoint     = "checkpoint-resend"
	RuleParkHolds      = "park-holds"
	RuleParkNoAttempt  = "park-no-attempt"
	RuleSubmitResend   = "submit-resend"
	RuleBroker         = "broker"
	RuleLogRoutes      = "log-routes"
	RuleArtifactsBytes = "artifact-bytes"
)

// spec is one row of the check as the catalogue defines it: the route (its
// id is the route) or the rule, its section, and what aq does when it is
// missing or wrong.
type spec struct {
	ID      string
	Section string
	Check   string // what the table's first column says
	Route   bool   // a route: Check is the route, its fallback the route book's
	// IfMissing and IfWrong say what aq does (for a rule): the
	// consequence, in the table's last column.
	IfMissing, IfWrong string
}

// catalogue is every row of the check, in the table's order (the
// contract's sections).
var catalogue = []spec{
	{ID: RuleUnknownRoute, Section: SecRequests, Check: "an unknown route answers 404 or 405",
		IfWrong: "aq tells a route the coordinator lacks by its 404 or 405: against this answer a missing optional route is taken for a failed call and its fallback never starts"},
	{ID: RuleUnknownJob, Section: SecRequests, Check: "a job it does not have answers 404 with a JSON body",
		IfMissing: "each such 404 costs aq one more request (GET /fleet/jobs/:id) to tell a missing job from a missing route",
		IfWrong:   "aq takes an answer about a job that does not exist for the job's"},
	{ID: RuleDateHeader, Section: SecRequests, Check: "answers carry a Date header",
		IfMissing: "lease expiries are taken as the coordinator states them, with no correction for a factory clock that is behind"},

	{ID: fleet.RouteEnroll, Section: SecEnroll, Route: true},
	{ID: fleet.RouteHeartbeat, Section: SecEnroll, Route: true},
	{ID: fleet.RouteDeregister, Section: SecEnroll, Route: true},

	{ID: fleet.RouteQueueState, Section: SecClaim, Route: true},
	{ID: RuleVersionMoves, Section: SecClaim, Check: "the queue-state version moves when a job is submitted",
		IfWrong: "a gated factory (AQ_FLEET_GATE=1) claims only when the version moves: it leaves new work queued until its 6-hour safety claim"},
	{ID: RuleVersionDue, Section: SecClaim, Check: "the queue-state version moves when a parked job comes due",
		IfWrong: "a gated factory (AQ_FLEET_GATE=1) does not see a job that became claimable by time alone (a park or a retry backoff passing) until its 6-hour safety claim"},
	{ID: fleet.RouteClaim, Section: SecClaim, Route: true},
	{ID: fleet.RouteAccept, Section: SecClaim, Route: true},
	{ID: RulePrevious, Section: SecClaim, Check: "a job handed out again carries how its last run ended",
		IfMissing: "the next attempt's engine is told what went wrong only when that attempt ran on the same factory; elsewhere it starts blind",
		IfWrong:   "the next attempt's engine is told another story than the run's own report"},
	{ID: RuleAcceptHeld, Section: SecClaim, Check: "an accept of a job a factory holds is refused (409)",
		IfWrong: "a dispatch message delivered twice (a redelivery, a re-publish) has two factories run the job"},

	{ID: fleet.RouteRenew, Section: SecLease, Route: true},
	{ID: fleet.RouteRelease, Section: SecLease, Route: true},
	{ID: RuleStaleEpoch, Section: SecLease, Check: "a write with a stale lease epoch is refused (409)",
		IfWrong: "a zombie factory (fenced, or its lease reaped) still moves the job: its reports overwrite the new holder's (split brain)"},
	{ID: RuleTerminalEnds, Section: SecLease, Check: "a terminal report ends the lease",
		IfWrong: "aq sends no release after a terminal report: the lease stays until it expires, and a reaper may put a finished job back in the queue"},

	{ID: fleet.RoutePatch, Section: SecReports, Route: true},

	{ID: fleet.RouteFail, Section: SecFail, Route: true},
	{ID: RuleParkHolds, Section: SecFail, Check: "a park holds the job until notBefore, then hands it out",
		IfMissing: "the parked job is handed out again at once: the factory whose engine is held does not offer it, another factory may take it and hit the same limit",
		IfWrong:   "a parked job is not handed out after its notBefore: it waits longer than the limit it waited for"},
	{ID: RuleParkNoAttempt, Section: SecFail, Check: "a park is not counted as an attempt",
		IfMissing: "each park spends one of the job's attempts: a job parked often runs out of retries without having failed"},

	{ID: RuleResend, Section: SecSpool, Check: "a re-sent report (PATCH, fail) is answered 2xx",
		IfWrong: "aq re-sends a report whose answer was lost (the spool): refused, it records a delivered report as fenced and drops the job's later reports"},
	{ID: RuleCheckpoint, Section: SecSpool, Check: "a re-sent building PATCH with a new checkpoint is stored",
		IfWrong: "a periodic checkpoint is lost: a job that is reaped or preempted resumes from an older checkpoint, and its work since is redone"},

	{ID: fleet.RouteArtifacts, Section: SecArtifact, Route: true},
	{ID: fleet.RouteArtifactList, Section: SecArtifact, Route: true},
	{ID: fleet.RouteArtifactGet, Section: SecArtifact, Route: true},
	{ID: RuleArtifactsBytes, Section: SecArtifact, Check: "an artifact reads back as the bytes uploaded",
		IfWrong: "aq job logs shows other bytes than the factory sent"},

	{ID: fleet.RouteLogAppend, Section: SecLogs, Route: true},
	{ID: fleet.RouteLogRead, Section: SecLogs, Route: true},
	{ID: RuleLogRoutes, Section: SecLogs, Check: "live log chunks (write and follow)",
		IfWrong: "a follower sees another log than the engine wrote: chunks lost, doubled or out of order, a fenced factory's output in the new run's log, or a run that never ends"},

	{ID: fleet.RouteSubmit, Section: SecSubmit, Route: true},
	{ID: RuleSubmitResend, Section: SecSubmit, Check: "a re-sent submit answers the same job",
		IfMissing: "a submit retried after a lost answer is refused as a conflict: aq submit reports an error although the job was created",
		IfWrong:   "a submit retried after a lost answer creates the job twice"},
	{ID: fleet.RouteJob, Section: SecSubmit, Route: true},
	{ID: fleet.RouteJobs, Section: SecSubmit, Route: true},
	{ID: fleet.RouteFactories, Section: SecSubmit, Route: true},
	{ID: fleet.RouteEvents, Section: SecSubmit, Route: true},
	{ID: fleet.RouteAction, Section: SecSubmit, Route: true},
	{ID: fleet.RouteReplace, Section: SecSubmit, Route: true},
	{ID: fleet.RouteRemove, Section: SecSubmit, Route: true},

	{ID: RuleBroker, Section: SecBroker, Check: "dispatch messages (Service Bus)"},
}

// required is what aq does without a route it cannot work without.
const required = "aq cannot work without it: check AQ_FLEET_API (docs/contract.md, \"Without a route: fallbacks\")"

// fallback is what aq does without route: the route book's fallback, or
// required.
func fallback(route string) string {
	if fb, ok := fleet.Fallbacks[route]; ok {
		return fb
	}
	return required
}
