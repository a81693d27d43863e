// Package job holds aq's domain types: the normalised job (a parsed,
// profile-merged manifest), stages, failure reasons, priorities and run
// insights. It has no behaviour beyond small pure helpers, so every other
// package (manifest, queue, runner, fleet) can share it.
package job

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Job is a normalised job: a manifest with its profile merged in, defaults
// applied and every value validated. Field names in JSON are stable (they are
// what `aq validate --json` prints).
type Job struct {
	ID             string   `json:"id"`
	Title          string   `json:"title"`
	Repo           string   `json:"repo"`
	RepoURL        string   `json:"repoUrl,omitempty"` // when the manifest named a git URL
	Base           string   `json:"base"`
	Product        string   `json:"product,omitempty"`
	Profile        string   `json:"profile,omitempty"`
	Engine         string   `json:"engine"` // an engine of engines.Known()
	Model          string   `json:"model,omitempty"`
	Capabilities   []string `json:"capabilities"`
	Priority       int      `json:"priority"`
	PriorityName   string   `json:"priorityName"`
	Budget         Budget   `json:"budget"`
	Deps           []string `json:"deps,omitempty"`
	DepsMode       string   `json:"depsMode"` // all|any
	IdempotencyKey string   `json:"idempotencyKey,omitempty"`
	Retry          Retry    `json:"retry"`
	Verify         string   `json:"verify,omitempty"`
	Script         string   `json:"script,omitempty"`
	Ship           string   `json:"ship"` // none|branch|pr|merge
	// MayChange are the protected paths (globs) the change may touch
	// (the manifest's may_change:); every other protected path refuses
	// the change (protected_change), and with one of these ship: merge
	// opens the PR without enabling auto-merge.
	MayChange []string `json:"mayChange,omitempty"`

	// VerifyRounds is how many repair rounds the job gets after a failed
	// verify (the manifest's verify_rounds:, else its profile's); nil: the
	// factory's AQ_VERIFY_ROUNDS decides.
	VerifyRounds *int `json:"verifyRounds,omitempty"`

	// Persona is the profile's body: the engine's standing instructions.
	Persona string `json:"persona,omitempty"`
	// Body is the manifest's markdown body: the task prompt.
	Body string `json:"body"`
	// Acceptance is the body's "## Acceptance" section (also inside Body):
	// the definition of done.
	Acceptance string `json:"acceptance,omitempty"`
	// Source is the manifest file the job was read from.
	Source string `json:"source,omitempty"`
}

// Budget limits one run of a job. Zero means unlimited.
type Budget struct {
	Wall   Duration `json:"wall"`
	USD    float64  `json:"usd"`
	Tokens int64    `json:"tokens"`
	Turns  int      `json:"turns,omitempty"`
	// Disk is what the job's run may add to the disk, in bytes of
	// allocated blocks (budget.disk; 0: the factory's AQ_JOB_DISK_MAX).
	Disk int64 `json:"disk,omitempty"`
}

// Retry is a job's retry policy for task failures.
type Retry struct {
	Max     int      `json:"max"`
	Backoff Duration `json:"backoff"`
}

// Defaults applied when neither manifest nor profile says otherwise.
const (
	DefaultBase     = "main"
	DefaultEngine   = "any"
	DefaultDepsMode = "all"
	DefaultShip     = "branch"
)

// DefaultWall bounds a job whose manifest sets no wall budget, so a hung
// engine can never hold a slot forever.
const DefaultWall = 2 * time.Hour

// DefaultBackoff is the first retry's wait when neither manifest nor profile
// sets retry.backoff (doubled per attempt: Backoff).
const DefaultBackoff = 30 * time.Second

// ShipModes are the ship: values.
var ShipModes = []string{"none", "branch", "pr", "merge"}

// Prompt is what the engine is given on stdin: the persona (unless the engine
// takes it separately, as claude does with --append-system-prompt), the task,
// and the definition of done.
func (j *Job) Prompt(withPersona bool) string {
	var b strings.Builder
	if withPersona && strings.TrimSpace(j.Persona) != "" {
		b.WriteString(strings.TrimSpace(j.Persona))
		b.WriteString("\n\n---\n\n")
	}
	b.WriteString(strings.TrimSpace(j.Body))
	b.WriteString("\n")
	if a := strings.TrimSpace(j.Acceptance); a != "" {
		b.WriteString("\n---\nDefinition of done (the job's acceptance criteria):\n")
		b.WriteString(a)
		b.WriteString("\n")
	}
	return b.String()
}

// JobBranch is the branch a job's result is committed to.
func JobBranch(id string) string { return "aq/job/" + id }

// WIPBranch is the branch (a ref; never checked out) holding a job's
// work-in-progress checkpoint.
func WIPBranch(id string) string { return "aq/wip/" + id }

// Priorities by name. Integers in manifests are accepted from 0 to 1000.
const (
	PriorityLow      = 100
	PriorityNormal   = 200
	PriorityHigh     = 300
	PriorityCritical = 400
	PriorityMax      = 1000
)

var priorityWords = map[string]int{"low": PriorityLow, "normal": PriorityNormal, "high": PriorityHigh, "critical": PriorityCritical}

// ParsePriority accepts low|normal|high|critical or an integer 0..1000.
func ParsePriority(s string) (int, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if p, ok := priorityWords[s]; ok {
		return p, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > PriorityMax {
		return 0, fmt.Errorf("priority %q is not low, normal, high, critical or an integer from 0 to %d", s, PriorityMax)
	}
	return n, nil
}

// PriorityName is the word for p, or its number when it is not one of the
// named levels.
func PriorityName(p int) string {
	for w, v := range priorityWords {
		if v == p {
			return w
		}
	}
	return strconv.Itoa(p)
}

// Duration is a time.Duration that reads and writes JSON as Go duration
// text ("45m0s"); it also reads a number of seconds.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration must be a string like \"45m\" or a number of seconds")
	}
	*d = Duration(time.Duration(secs * float64(time.Second)))
	return nil
}
