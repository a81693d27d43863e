package queue

import (
	"slices"
	"time"

	"github.com/aqfleet/aq/job"
)

// State is a job's queue state: the sidecar <stage>/<id>.json. Field names in
// JSON are stable; the package comment documents them.
type State struct {
	ID             string    `json:"id"`
	Title          string    `json:"title,omitempty"`
	Repo           string    `json:"repo,omitempty"`
	Engine         string    `json:"engine,omitempty"`
	Stage          job.Stage `json:"stage"`
	Priority       int       `json:"priority"`
	Capabilities   []string  `json:"capabilities,omitempty"`
	Deps           []string  `json:"deps,omitempty"`
	DepsMode       string    `json:"depsMode,omitempty"`
	IdempotencyKey string    `json:"idempotencyKey,omitempty"`
	Retry          job.Retry `json:"retry"`

	// Attempts counts runs started; Next increments it.
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// NotBefore holds a retried job in the inbox until its backoff ends,
	// and a parked job until its engine's limit resets.
	NotBefore time.Time `json:"notBefore,omitzero"`
	// Parked says what a parked job waits for ("claude usage limit"); set
	// by Park, cleared when the job is taken or requeued. Parks counts the
	// times the job was parked.
	Parked string `json:"parked,omitempty"`
	Parks  int    `json:"parks,omitempty"`
	// StartedAt and EndedAt bound the last run.
	StartedAt time.Time `json:"startedAt,omitzero"`
	EndedAt   time.Time `json:"endedAt,omitzero"`
	// Host and PID name the process that took the job last.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`

	// Reason and Detail say why the job is where it is after a failure.
	Reason   job.Reason    `json:"reason,omitempty"`
	Detail   string        `json:"detail,omitempty"`
	Insights *job.Insights `json:"insights,omitempty"`
	Branch   string        `json:"branch,omitempty"`
	PR       string        `json:"pr,omitempty"` // pull request URL
	// Checkpoint is the commit of the job's WIP ref (job.WIPBranch).
	Checkpoint string `json:"checkpoint,omitempty"`
	// Previous is how the job's previous attempt ended (reason, detail,
	// its failed verify), kept by Next when it takes the job again, for the
	// run to tell its engine; nil on a first attempt or after a requeue.
	Previous *job.Previous `json:"previous,omitempty"`

	// History has one entry per stage change, oldest first.
	History []Transition `json:"history"`
}

// Transition is one stage change. From is empty for the first entry.
type Transition struct {
	At     time.Time  `json:"at"`
	From   job.Stage  `json:"from,omitempty"`
	To     job.Stage  `json:"to"`
	Reason job.Reason `json:"reason,omitempty"`
	Detail string     `json:"detail,omitempty"`
}

// Entry is a job as the queue holds it: its state and where its manifest is.
type Entry struct {
	State        State  `json:"state"`
	ManifestPath string `json:"manifestPath"`
}

// newState is the initial state of a submitted job.
func newState(j *job.Job, stage job.Stage, created, now time.Time) State {
	mode := j.DepsMode
	if mode == "" {
		mode = job.DefaultDepsMode
	}
	return State{
		ID: j.ID, Title: j.Title, Repo: j.Repo, Engine: j.Engine, Stage: stage, Priority: j.Priority,
		Capabilities: slices.Clone(j.Capabilities), Deps: slices.Clone(j.Deps), DepsMode: mode,
		IdempotencyKey: j.IdempotencyKey, Retry: j.Retry,
		CreatedAt: created, UpdatedAt: now,
	}
}

// clone is a deep copy, so callers and callbacks cannot change cached or
// in-flight state through shared slices.
func (s State) clone() State {
	c := s
	c.Capabilities = slices.Clone(s.Capabilities)
	c.Deps = slices.Clone(s.Deps)
	c.History = slices.Clone(s.History)
	if s.Insights != nil {
		in := *s.Insights
		in.Runs = slices.Clone(s.Insights.Runs)
		c.Insights = &in
	}
	if s.Previous != nil {
		p := *s.Previous
		c.Previous = &p
	}
	return c
}

// before orders jobs for Next: higher priority first, then oldest, then id.
func before(a, b State) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.Before(b.CreatedAt)
	}
	return a.ID < b.ID
}

func compare(a, b State) int {
	switch {
	case before(a, b):
		return -1
	case before(b, a):
		return 1
	}
	return 0
}
