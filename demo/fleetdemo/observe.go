package fleetdemo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/demo/coord"
)

// observations are what the demo saw happen, for the checks.
type observations struct {
	setupErr error
	aborted  error

	// phase 1: the jobs running at once (factory → "job (repo)"), read
	// from the daemons' status files.
	parallel     map[string][]string
	parallelRepo int

	// phase 2: web-nav waiting behind a same-repo job (broker: the
	// factory's status file says so; poll: it stayed queued).
	navWaits   string
	gate2      time.Time
	serialNote string
	serialOK   bool

	// setup (legacy routes): why each factory refused the broker.
	refused map[string]string

	// phase 3.
	failJob string

	// phase 4.
	cp1           string // attempt 1's checkpoint (the /fleet/fail's)
	originAfter1  string // origin's aq/wip/api-resume right after it
	step1Files    bool   // origin's WIP has step-1.txt
	killed        string // the factory killed with -9
	killedPID     int
	killedEpoch   int64
	killedAt      time.Time
	killedSignal  string
	statusAfter   *daemon.Status
	orphanEngines []int // the killed daemon's engine, seen just before the kill
	// engineStopped: how long after the kill -9 nothing carried the job's
	// tag any more (its supervisor stopped it); -1 if it never happened.
	engineStopped time.Duration
	reapedAfter   time.Duration
	resumer       string
	resultFiles   []string
	wipBefore     string // origin's aq/wip/api-resume before the zombie restarts
	wipAfter      string
	zombieUp      bool
	zombieLocal   []string // the zombie's local aq/wip/api-resume files
	zombieEngines []int    // its old engine after recovery
	zombieRecord  string

	// phase 5.
	merged      string // the job whose branch the operator merged
	gc          []GCRow
	mergedGone  bool
	zombieKept  bool
	originAfter map[string]string

	// the end.
	stopped     map[string]int
	leftovers   []string
	leftoverErr error
}

// git runs git with the demo's isolated configuration.
func (r *run) git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(append([]string{}, r.env...),
		"GIT_AUTHOR_NAME=aq demo", "GIT_AUTHOR_EMAIL=demo@aq.invalid", "GIT_COMMITTER_NAME=aq demo", "GIT_COMMITTER_EMAIL=demo@aq.invalid")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

var seedFiles = map[string]map[string]string{
	"api":  {"README.md": "# api\n", "main.go": "package main\n\nfunc main() {}\n"},
	"web":  {"index.html": "<html><head><title>Helo</title></head><body></body></html>\n"},
	"docs": {"README.md": "# docs\n"},
}

// makeRepos makes a bare origin per repo, seeded with one commit on main.
func (r *run) makeRepos(ctx context.Context) error {
	for _, name := range repoNames {
		seed := filepath.Join(r.ws, "seed", name)
		bare := filepath.Join(r.ws, "origins", name+".git")
		if err := os.MkdirAll(seed, 0o755); err != nil {
			return err
		}
		for f, body := range seedFiles[name] {
			if err := os.WriteFile(filepath.Join(seed, f), []byte(body), 0o644); err != nil {
				return err
			}
		}
		for _, step := range [][]string{
			{"init", "-q", "--bare", "-b", "main", bare},
			{"-C", seed, "init", "-q", "-b", "main"},
			{"-C", seed, "add", "-A"},
			{"-C", seed, "commit", "-q", "-m", "initial commit"},
			{"-C", seed, "push", "-q", bare, "main"},
		} {
			if _, err := r.git(ctx, r.ws, step...); err != nil {
				return err
			}
		}
	}
	return os.RemoveAll(filepath.Join(r.ws, "seed"))
}

// cloneRepos clones every origin into base.
func (r *run) cloneRepos(ctx context.Context, base string) error {
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	for _, name := range repoNames {
		if _, err := r.git(ctx, base, "clone", "-q", filepath.Join(r.ws, "origins", name+".git"), name); err != nil {
			return err
		}
	}
	return nil
}

// originRef is origin's value of refs/heads/<ref> in repo ("" when absent).
func (r *run) originRef(ctx context.Context, repo, ref string) string {
	out, err := r.git(ctx, r.ws, "-C", filepath.Join(r.ws, "origins", repo+".git"), "rev-parse", "--verify", "--quiet", "refs/heads/"+ref)
	if err != nil {
		return ""
	}
	return out
}

// originRefs lists origin's refs under refs/heads/aq/ (name → sha).
func (r *run) originRefs(ctx context.Context, repo string) map[string]string {
	out, _ := r.git(ctx, r.ws, "-C", filepath.Join(r.ws, "origins", repo+".git"), "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/aq/")
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if name, sha, ok := strings.Cut(l, " "); ok {
			m[name] = sha
		}
	}
	return m
}

// files lists the files of rev in the repository at dir.
func (r *run) files(ctx context.Context, dir, rev string) []string {
	out, err := r.git(ctx, r.ws, "-C", dir, "ls-tree", "-r", "--name-only", rev)
	if err != nil || out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// marker reads a marker file an engine script wrote (its content, trimmed;
// its modification time), ok false when absent.
func (r *run) marker(name string) (string, time.Time, bool) {
	p := filepath.Join(r.sig, name)
	st, err := os.Stat(p)
	if err != nil {
		return "", time.Time{}, false
	}
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b)), st.ModTime(), true
}

// touch creates a signal file for the engines (a gate).
func (r *run) touch(name string) error {
	return os.WriteFile(filepath.Join(r.sig, name), []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), 0o644)
}

// job is the stub's job document.
func (r *run) job(id string) coord.Job {
	j, _ := r.stub.Job(id)
	return j
}

// held reports who holds id's lease now, at which epoch ("" when nobody).
func (r *run) held(id string) (string, int64) {
	j := r.job(id)
	if j.Stage == coord.StageAssigned || j.Stage == coord.StageBuilding {
		return j.Holder, j.LeaseEpoch
	}
	return "", 0
}

// beating reports whether factory's last heartbeat lists job id as running
// (the publisher weighs factories by what their heartbeats say).
func (r *run) beating(factory, id string) bool {
	for _, f := range r.stub.Factories() {
		if f.ID != factory {
			continue
		}
		for _, rj := range f.Running {
			if rj.JobID == id {
				return true
			}
		}
	}
	return false
}

// settle waits until every factory's last heartbeat lists exactly the jobs
// the stub says it holds. The stub's publisher weighs factories by their
// heartbeats (busy repos, free seats): a heartbeat that still lists a job
// that just finished would make it steer the next job elsewhere.
func (r *run) settle(ctx context.Context) error {
	return r.waitFor(ctx, "the factories' heartbeats to catch up", func() bool {
		held := map[string][]string{}
		for _, j := range r.stub.Jobs() {
			if j.Stage == coord.StageAssigned || j.Stage == coord.StageBuilding {
				held[j.Holder] = append(held[j.Holder], j.ID)
			}
		}
		for _, f := range r.stub.Factories() {
			var beat []string
			for _, rj := range f.Running {
				beat = append(beat, rj.JobID)
			}
			slices.Sort(beat)
			slices.Sort(held[f.ID])
			if !slices.Equal(beat, held[f.ID]) {
				return false
			}
		}
		return true
	})
}

// events returns id's audit trail of one kind (any kind when kind is "").
func (r *run) events(id, kind string) []coord.Event {
	var out []coord.Event
	for _, e := range r.stub.Events(id) {
		if kind == "" || e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// lastEvent is the last event of one of kinds, and whether there is one.
func (r *run) lastEvent(id string, kinds ...string) (coord.Event, bool) {
	evs := r.stub.Events(id)
	for i := len(evs) - 1; i >= 0; i-- {
		if slices.Contains(kinds, evs[i].Kind) {
			return evs[i], true
		}
	}
	return coord.Event{}, false
}

// failures are the events that report a failed run: /fleet/fail's "fail",
// or — legacy routes, no /fleet/fail — the fallback PATCH's "stage" to
// failed or queued (its Detail set to the job's reason, as fail's carries
// it). The lease release that follows the PATCH is its own event.
func (r *run) failures(id string) []coord.Event {
	var out []coord.Event
	for _, e := range r.stub.Events(id) {
		switch {
		case e.Kind == "fail":
			out = append(out, e)
		case r.legacy() && e.Kind == "stage" && (e.Stage == coord.StageFailed || e.Stage == coord.StageQueued):
			if e.Detail == "" {
				e.Detail = r.job(id).Reason
			}
			out = append(out, e)
		}
	}
	return out
}

// lastFailure is the last of failures, and whether there is one.
func (r *run) lastFailure(id string) (coord.Event, bool) {
	fs := r.failures(id)
	if len(fs) == 0 {
		return coord.Event{}, false
	}
	return fs[len(fs)-1], true
}

// released is the release of id's lease at epoch after a fallback PATCH.
func (r *run) released(id string, epoch int64) (coord.Event, bool) {
	for _, e := range r.stub.Events(id) {
		if e.Kind == "released" && e.Epoch == epoch {
			return e, true
		}
	}
	return coord.Event{}, false
}

// failCall narrates how a failure was reported.
func (r *run) failCall(id string, fail coord.Event, extra string) string {
	if r.legacy() {
		return fmt.Sprintf("PATCH /fleet/jobs/%s {stage: %s, reason: %s%s} + POST /fleet/jobs/%s/lease/release (the coordinator has no /fleet/fail)",
			id, fail.Stage, fail.Detail, extra, id)
	}
	return fmt.Sprintf("POST /fleet/fail {reason: %s%s}", fail.Detail, extra)
}

// takeEvent is the claim or accept that started epoch.
func (r *run) takeEvent(id string, epoch int64) (coord.Event, bool) {
	for _, e := range r.stub.Events(id) {
		if (e.Kind == "claimed" || e.Kind == "accepted") && e.Epoch == epoch {
			return e, true
		}
	}
	return coord.Event{}, false
}

// message is the broker message that dispatched id's epoch: the one the
// stub published while the job waited at epoch-1.
func (r *run) message(id string, epoch int64) (coord.Sent, bool) {
	r.sentMu.Lock()
	defer r.sentMu.Unlock()
	for i := len(r.sent) - 1; i >= 0; i-- {
		if s := r.sent[i]; s.JobID == id && s.Epoch == epoch-1 {
			return s, true
		}
	}
	return coord.Sent{}, false
}

// routedTo is where the peer routed a message (its subscriptions' paths).
func (r *run) routedTo(messageID string) []string {
	evs, _ := r.peer.Events()
	for _, e := range evs {
		if e.Event == "send" && e.MessageID == messageID {
			return e.RoutedTo
		}
	}
	return nil
}

// subOf is the subscription name of a peer queue path
// (fleet-dispatch/Subscriptions/factory-a → factory-a).
func subOf(path string) string {
	_, name, _ := strings.Cut(path, "/Subscriptions/")
	return name
}

// took narrates how job id reached its holder at epoch: the targeted
// message and where the peer routed it (broker), or the claim (poll).
func (r *run) took(id string, epoch int64, holder string) string {
	ev, _ := r.takeEvent(id, epoch)
	if ev.Kind == "accepted" {
		if m, ok := r.message(id, epoch); ok {
			var subs []string
			for _, p := range r.routedTo(m.MessageID) {
				subs = append(subs, subOf(p))
			}
			return fmt.Sprintf("message %s targeted at %s, routed to subscription %s only → accepted by %s, epoch %d",
				m.MessageID, m.Target, strings.Join(subs, "+"), holder, epoch)
		}
		return fmt.Sprintf("accepted by %s from its subscription, epoch %d", holder, epoch)
	}
	return fmt.Sprintf("claimed by %s (POST /fleet/claim after the queue-state version moved), epoch %d", holder, epoch)
}

// waitTaken waits until a factory took id at an epoch above after (the
// stub's audit trail) and, while it still holds it, its heartbeat says so:
// the publisher weighs factories by their heartbeats, so the next job is
// dispatched knowing this one. It returns the taker and the epoch.
func (r *run) waitTaken(ctx context.Context, id string, after int64) (string, int64, error) {
	var holder string
	var epoch int64
	err := r.waitFor(ctx, id+" to be taken by a factory", func() bool {
		ev, ok := r.lastEvent(id, "claimed", "accepted")
		if !ok || ev.Epoch <= after {
			return false
		}
		holder, epoch = ev.Factory, ev.Epoch
		if h, e := r.held(id); h == holder && e == epoch {
			return r.beating(holder, id)
		}
		return true // already done with it
	})
	return holder, epoch, err
}

// waitStage waits until job id is in one of stages (the stub's view).
func (r *run) waitStage(ctx context.Context, id string, stages ...string) error {
	return r.waitFor(ctx, id+" to reach "+strings.Join(stages, " or "), func() bool {
		return slices.Contains(stages, r.job(id).Stage)
	})
}
