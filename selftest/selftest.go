// Package selftest is `aq selftest`: named checks that say whether this host
// is ready to be a factory and whether this build's pipeline works, end to
// end, offline.
//
// The checks come in two groups:
//
//   - host: readiness of this machine — git and its version, gh and its
//     login, each engine and its pre-flight, $AQ_HOME and its locks, the repo
//     base, file locks, the clock, the configuration, the price table and
//     profiles, the credentials file, and (in fleet mode) the coordinator and
//     the Service Bus settings. A check that does not apply here is skipped
//     with a one-line reason.
//   - pipeline: an offline run of the real pipeline in a throw-away directory:
//     manifests, the folder queue, worktrees, locks, checkpoints, the kill
//     ladder, budgets, verify, retries and the dead letter, recovery after
//     kill -9, the fleet contract against the coordinator stub (fencing,
//     /fleet/fail, the report spool, the gated poll), broker delivery through
//     the local AMQP peer, gc, and secrets.
//
// Every check ends pass, fail or skip with a one-line reason and its
// duration, under its own deadline: a check that hangs fails with a reason
// instead of hanging the run, and the processes it started are stopped by the
// kill ladder. The pipeline leaves nothing behind: its temp dir is removed,
// no process carrying one of its job tags survives, git runs with an
// isolated configuration, and the real $AQ_HOME is only touched by the host
// probes, which remove what they create. The last checks prove it.
//
// The package never imports testing: it runs inside the aq binary.
package selftest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/version"
)

// Group is a group of checks.
type Group string

// The groups, in the order they are listed.
const (
	GroupHost     Group = "host"
	GroupPipeline Group = "pipeline"
	// GroupEngines runs each engine CLI installed here through a tiny job
	// against a fake API (engines.go). It is not part of a default run:
	// `aq selftest --engines` adds it, `--group engines` runs it alone.
	GroupEngines Group = "engines"
)

// Groups lists every group.
var Groups = []Group{GroupHost, GroupPipeline, GroupEngines}

// Status is how a check ended.
type Status string

// Statuses.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip" // not applicable here; the reason says why
)

// Check is one named check as `aq selftest --list` shows it.
type Check struct {
	Name        string `json:"name"`
	Group       Group  `json:"group"`
	Description string `json:"description"`
	// SkipsWhen says when the check is skipped instead of run ("" never).
	SkipsWhen string `json:"skipsWhen,omitempty"`
}

// Result is one check's outcome. Field names are stable (`aq selftest
// --json`; docs/selftest.md).
type Result struct {
	Name   string `json:"name"`
	Group  Group  `json:"group"`
	Status Status `json:"status"`
	// Reason is one line: what was proven, why it failed, or why it was
	// skipped. It never holds a secret.
	Reason     string        `json:"reason"`
	DurationMS int64         `json:"durationMs"`
	Duration   time.Duration `json:"-"`
}

// Counts are results by status.
type Counts struct {
	Total int `json:"total"`
	Pass  int `json:"pass"`
	Fail  int `json:"fail"`
	Skip  int `json:"skip"`
}

// Report is a whole run. Field names are stable (`aq selftest --json`).
type Report struct {
	// OK is true when no check failed.
	OK         bool      `json:"ok"`
	Version    string    `json:"version"`
	StartedAt  time.Time `json:"startedAt"`
	DurationMS int64     `json:"durationMs"`
	Counts     Counts    `json:"counts"`
	// Checks are in catalog order (host first, then pipeline).
	Checks []Result `json:"checks"`

	// Workspace is the pipeline's temp dir (removed before Run returns;
	// empty when no pipeline check ran), and Tags the job ids (with their
	// scopes) whose processes the pipeline started: what a caller needs to
	// verify independently that nothing was left behind.
	Workspace string `json:"-"`
	Tags      []Tag  `json:"-"`
}

// Tag is a job id and the scope (AQ_SCOPE) its processes carried.
type Tag struct {
	ID    string
	Scope string
}

// Failed returns the failed results.
func (r *Report) Failed() []Result {
	var out []Result
	for _, c := range r.Checks {
		if c.Status == Fail {
			out = append(out, c)
		}
	}
	return out
}

// Options configure a run.
type Options struct {
	// Config is aq's effective configuration; ConfigErr is why it did not
	// load (host.config.valid then fails and the host checks that need it
	// are skipped).
	Config    *config.Config
	ConfigErr error
	// Group limits the run to one group ("" runs host and pipeline, and
	// engines with Engines).
	Group Group
	// Engines adds the engines group to a run of every group.
	Engines bool
	// Only limits the run to the checks whose name it matches.
	Only *regexp.Regexp
	// Exe is the aq binary the recovery check runs as a child (`aq run
	// --once`, killed -9). Default: os.Executable(), unless that is a Go
	// test binary (the check is then skipped).
	Exe string
	// Env is the host environment the host checks look at (PATH for tools
	// and engines); nil means os.Environ().
	Env []string
	// TempDir is where the pipeline's workspace is made (default
	// os.TempDir()).
	TempDir string
	// Timeout bounds the whole run (default 3 minutes); each check has its
	// own, shorter deadline besides.
	Timeout time.Duration
	// Parallel is how many pipeline scenarios run at once (default 6).
	Parallel int
	// PeerDir is demo/sbpeer (the local AMQP peer); default: found above
	// the working directory or the executable.
	PeerDir string
	// Log receives the pipeline's own logs (default: discarded).
	Log *slog.Logger
	// OnResult, if set, is called with each selected check's result in
	// catalog order, as soon as it and every check before it are done.
	OnResult func(Result)

	// For the package's own tests: other scenarios than the catalog's, and
	// a shorter wait for a check whose deadline passed.
	scenarios []*scenario
	hungGrace time.Duration
}

func (o *Options) scenarioList() []*scenario {
	if o.scenarios != nil {
		return o.scenarios
	}
	return scenarios()
}

func (o *Options) selected(c Check) bool {
	if o.Group != "" && c.Group != o.Group {
		return false
	}
	if o.Group == "" && c.Group == GroupEngines && !o.Engines {
		return false
	}
	return o.Only == nil || o.Only.MatchString(c.Name)
}

// Catalog lists every check, in order.
func Catalog() []Check {
	var out []Check
	for _, sc := range scenarios() {
		for _, c := range sc.checks {
			c.SkipsWhen = skipsWhen[c.Name]
			out = append(out, c)
		}
	}
	return out
}

// Select lists the checks o selects, in order.
func Select(o Options) []Check {
	var out []Check
	for _, c := range Catalog() {
		if o.selected(c) {
			out = append(out, c)
		}
	}
	return out
}

// ParseGroup reads a --group value.
func ParseGroup(s string) (Group, error) {
	for _, g := range Groups {
		if string(g) == s {
			return g, nil
		}
	}
	return "", fmt.Errorf("unknown group %q", s)
}

// Run runs the selected checks and returns the report. The error is only for
// a run that could not start at all (no check selected, no temp dir); every
// check's own failure is in the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	start := time.Now()
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.Parallel <= 0 {
		o.Parallel = 6
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	list := o.scenarioList()
	var cat []Check
	for _, sc := range list {
		cat = append(cat, sc.checks...)
	}
	rec := newRecorder(cat, &o)
	if rec.selectedCount() == 0 {
		return nil, fmt.Errorf("no check is selected")
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	h := newHostEnv(&o)
	rep := &Report{Version: version.Get().Version, StartedAt: start.UTC()}

	var all []*scenario
	var last []*scenario // run after everything else (cleanup checks)
	for _, sc := range list {
		if !rec.anySelected(sc) {
			continue
		}
		if sc.last {
			last = append(last, sc)
		} else {
			all = append(all, sc)
		}
	}

	var ws *workspace
	if needsWorkspace(all, last) {
		var err error
		ws, err = newWorkspace(ctx, &o, h)
		if err != nil {
			return nil, err
		}
		rep.Workspace = ws.root
	}

	sem := make(chan struct{}, o.Parallel)
	var wg sync.WaitGroup
	for _, sc := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sc.group == GroupPipeline {
				select {
				case sem <- struct{}{}:
					defer func() { <-sem }()
				case <-ctx.Done():
				}
			}
			runScenario(ctx, sc, rec, h, ws)
		}()
	}
	wg.Wait()
	if ws != nil {
		ws.close()
		rep.Tags = ws.tags()
	}
	// The clean-up checks run even when the run was interrupted or ran out
	// of time: they are what leaves nothing behind.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer ccancel()
	for _, sc := range last {
		runScenario(cctx, sc, rec, h, ws)
	}

	rep.Checks = rec.finish()
	for _, c := range rep.Checks {
		rep.Counts.Total++
		switch c.Status {
		case Pass:
			rep.Counts.Pass++
		case Fail:
			rep.Counts.Fail++
		case Skip:
			rep.Counts.Skip++
		}
	}
	rep.OK = rep.Counts.Fail == 0
	rep.DurationMS = time.Since(start).Milliseconds()
	return rep, nil
}

// cleanupTimeout bounds the clean-up checks.
const cleanupTimeout = 30 * time.Second

func needsWorkspace(lists ...[]*scenario) bool {
	for _, l := range lists {
		for _, sc := range l {
			if sc.workspace {
				return true
			}
		}
	}
	return false
}

// recorder collects results in catalog order and hands the selected ones to
// OnResult as soon as every earlier one is known.
type recorder struct {
	o       *Options
	red     *secrets.Redactor
	mu      sync.Mutex
	order   []Check
	index   map[string]int
	results map[string]*Result
	next    int // index in order of the next result to hand out
}

func newRecorder(cat []Check, o *Options) *recorder {
	r := &recorder{o: o, index: map[string]int{}, results: map[string]*Result{}}
	for _, c := range cat {
		if o.selected(c) {
			r.index[c.Name] = len(r.order)
			r.order = append(r.order, c)
		}
	}
	// Reasons never carry a secret: aq's own, and every secret-named
	// variable of the environment, are masked.
	r.red = secrets.NewRedactor(o.Env)
	if o.Config != nil {
		r.red.Add(o.Config.Secrets()...)
	}
	return r
}

func (r *recorder) selectedCount() int { return len(r.order) }

func (r *recorder) wanted(name string) bool {
	_, ok := r.index[name]
	return ok
}

func (r *recorder) anySelected(sc *scenario) bool {
	for _, c := range sc.checks {
		if r.wanted(c.Name) {
			return true
		}
	}
	return false
}

func (r *recorder) reported(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.results[name]
	return ok
}

// add records a result (the first one for a name wins).
func (r *recorder) add(res Result) {
	res.Reason = r.red.String(brief.OneLine(res.Reason, maxReason))
	res.DurationMS = res.Duration.Milliseconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.index[res.Name]
	if !ok {
		return
	}
	if _, dup := r.results[res.Name]; dup {
		return
	}
	res.Group = r.order[i].Group
	r.results[res.Name] = &res
	r.flushLocked()
}

func (r *recorder) flushLocked() {
	for r.next < len(r.order) {
		res, ok := r.results[r.order[r.next].Name]
		if !ok {
			return
		}
		r.next++
		if r.o.OnResult != nil {
			r.o.OnResult(*res)
		}
	}
}

// finish fills any check that never reported (it cannot happen unless a
// scenario is wrong) and returns every result in order.
func (r *recorder) finish() []Result {
	for _, c := range r.order {
		if !r.reported(c.Name) {
			r.add(Result{Name: c.Name, Status: Fail, Reason: "not run: the run ended before this check"})
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Result, 0, len(r.order))
	for _, c := range r.order {
		out = append(out, *r.results[c.Name])
	}
	return out
}

// maxReason bounds a reason's length.
const maxReason = 400

// defaultExe is the aq binary for the child-process checks: this process's
// executable, unless it is a Go test binary (running that with aq's
// arguments would run the tests).
func defaultExe() string {
	exe, err := os.Executable()
	if err != nil || strings.HasSuffix(filepath.Base(exe), ".test") {
		return ""
	}
	return exe
}
