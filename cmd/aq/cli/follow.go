package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

// Following a job's log (`aq job logs -f`, the board's log view): the
// engine's output rendered for a person through engines.Transcript (or raw),
// and the job's stage changes, until the job ends. The log is read from this
// host's $AQ_HOME/logs/<id>/stdout.log while it grows; a fleet job that runs
// or ran on another factory is read from the coordinator: its events, and
// its live log while it runs (GET /fleet/jobs/:id/log, long-polled) — or,
// from a coordinator without one, its engine-stdout artifact once it ended.

// jobWatch says where a job is. Poll returns the stage changes since the
// last call, as lines for a person, and whether the job has ended.
type jobWatch interface {
	Poll(ctx context.Context) (changes []string, ended bool, err error)
}

// follower follows one job.
type follower struct {
	id    string
	watch jobWatch
	// logPath is the engine output on this host ("" when the job never ran
	// here); remote fetches the engine-stdout artifact once the job ended
	// (nil: no coordinator).
	logPath string
	remote  *fleet.Client
	// live follows the job's live log at the coordinator (nil: the job
	// runs here, or local mode).
	live  *remoteLog
	raw   bool
	every time.Duration
	// meta receives what is not the engine's output (stage changes,
	// notes) when raw keeps stdout to the engine's own lines; nil: emit.
	meta func(string)
	// rec, when set, receives every line as a record instead (aq job logs
	// -f --json): the engine's notes with their kind, the rest as events.
	rec func(logRecord)

	tr       *engines.Transcript
	offset   int64
	partial  []byte
	sawLocal bool
	lastErr  string
}

// run follows until the job ends (nil), ctx ends (nil) or the job cannot
// be read at all (the first Poll's error). emit gets each line.
func (fo *follower) run(ctx context.Context, emit func(string)) error {
	if fo.tr == nil {
		fo.tr = engines.NewTranscript("", "", nil)
	}
	every := fo.every
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	first := true
	for {
		if !first {
			// The log before the stage changes: a run's last lines are
			// written before its stage moves.
			fo.readLocal(emit, false)
		}
		if fo.live != nil && !first {
			// Long-polled: this is the loop's wait while the job runs.
			t0 := time.Now()
			if got := fo.readLive(ctx, emit, every); !got {
				if !sleepCtx(ctx, every-time.Since(t0)) {
					return nil
				}
			}
		}
		changes, ended, err := fo.watch.Poll(ctx)
		switch {
		case err != nil && first:
			return err
		case err != nil:
			if msg := err.Error(); msg != fo.lastErr {
				fo.lastErr = msg
				fo.note(emit, "! "+msg+" (still trying)")
			}
		default:
			if fo.lastErr != "" {
				fo.lastErr = ""
				fo.note(emit, "· the coordinator answers again")
			}
		}
		if ended && fo.live != nil && !first {
			// The run's last lines before its end: its factory sent them
			// before the final report.
			fo.finishLive(ctx, emit)
		}
		for _, c := range changes {
			fo.note(emit, c)
		}
		if first {
			fo.readLocal(emit, false) // the history first, then the log so far
			switch {
			case fo.live != nil && ended:
				fo.finishLive(ctx, emit)
			case fo.live != nil:
				fo.readLive(ctx, emit, 0)
			}
			first = false
		}
		if ended {
			fo.readLocal(emit, true)
			switch {
			case fo.live != nil && fo.live.shown:
				fo.liveSummary(emit)
			case !fo.sawLocal && fo.remote != nil:
				fo.readRemote(ctx, emit)
			}
			return nil
		}
		if fo.live == nil && !sleepCtx(ctx, every) {
			return nil
		}
	}
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// remoteLog is where a follower is in a job's live log: the run it follows
// (from the oldest the coordinator keeps, each to its end, then the next)
// and its offset in that run's stream.
type remoteLog struct {
	c      *fleet.Client
	epoch  int64 // 0: no run yet
	offset int64
	// off: the coordinator has no live log, or answered what is not one;
	// the engine's output comes from the artifact at the job's end.
	off   bool
	shown bool // some of the live log was shown
	// ended: the run followed was read to its end, and no newer run began.
	ended bool
	gaps  int64 // bytes not streamed, in the runs shown
	said  int64 // the run last announced
}

// readLive shows what the job's live log gained past the follower's place,
// waiting up to wait for it (a long poll); it reports whether there was
// something.
func (fo *follower) readLive(ctx context.Context, emit func(string), wait time.Duration) bool {
	lv := fo.live
	if lv == nil || lv.off {
		return false
	}
	got := false
	for range 64 { // pages and runs: bounded, the next loop goes on
		p, err := lv.c.ReadLog(ctx, fo.id, fleet.LogQuery{Epoch: lv.epoch, Offset: lv.offset, Wait: wait})
		switch {
		case fleet.IsRouteAbsent(err):
			lv.off = true
			fo.note(emit, "· the coordinator has no GET /fleet/jobs/:id/log: the engine's output shows when the job ends (from its artifacts)")
			return got
		case isRefused(err):
			lv.off = true
			fo.note(emit, "! the coordinator's live log cannot be read ("+err.Error()+"): the engine's output shows when the job ends (from its artifacts)")
			return got
		case err != nil:
			return got // away: the stage poll says so, and the next call tries again
		}
		wait = 0
		if lv.epoch == 0 {
			if p.LeaseEpoch == 0 {
				return got // no run has streamed yet
			}
			lv.epoch, lv.offset = p.LeaseEpoch, 0
			if len(p.Runs) > 0 && p.Runs[0].LeaseEpoch != p.LeaseEpoch {
				lv.epoch = p.Runs[0].LeaseEpoch // from the oldest run kept
				continue
			}
		}
		lv.ended = false
		if lv.said != lv.epoch {
			lv.said = lv.epoch
			fo.note(emit, fmt.Sprintf("· engine output of attempt %d, live from factory %s", p.Attempt, orDash(p.FactoryID)))
		}
		for _, r := range p.Records {
			got, lv.shown = true, true
			if r.Kind == fleet.LogGap {
				fo.flushPartial(emit)
				lv.gaps += r.Size
				msg := fmt.Sprintf("… %d bytes not streamed: they are in the job's final artifact (aq job logs --stream stdout %s) …", r.Size, fo.id)
				if fo.rec != nil {
					fo.rec(logRecord{Job: fo.id, Kind: "gap", Text: msg})
					continue
				}
				fo.note(emit, msg)
				continue
			}
			fo.feed([]byte(r.Text), emit)
		}
		lv.offset = p.Next
		if !p.Ended || p.Next < runSize(p) {
			if len(p.Records) > 0 && p.Next < runSize(p) {
				continue // the answer was capped: read on
			}
			return got
		}
		// The run is over: on to the next one, if any.
		next := int64(0)
		for _, r := range p.Runs {
			if r.LeaseEpoch > lv.epoch {
				next = r.LeaseEpoch
				break
			}
		}
		if next == 0 {
			fo.flushPartial(emit)
			lv.ended = true
			return got
		}
		fo.flushPartial(emit)
		lv.epoch, lv.offset = next, 0
	}
	return got
}

// runSize is the length of the page's run as the coordinator lists it.
func runSize(p *fleet.LogPage) int64 {
	for _, r := range p.Runs {
		if r.LeaseEpoch == p.LeaseEpoch {
			return r.Size
		}
	}
	return p.Next
}

// finishLive reads the live log to the end of its last run once the job
// ended: its factory sent the end before the final report, so this is
// short; a stream that never ends (its factory lost) is left after a few
// tries.
func (fo *follower) finishLive(ctx context.Context, emit func(string)) {
	for range 3 {
		fo.readLive(ctx, emit, 2*time.Second)
		if fo.live.off || fo.live.ended || ctx.Err() != nil {
			return
		}
	}
}

// liveSummary says, at the end, what the live log did not carry.
func (fo *follower) liveSummary(emit func(string)) {
	lv := fo.live
	switch {
	case lv.gaps > 0:
		fo.note(emit, fmt.Sprintf("· %d bytes of the engine's output were not streamed; the whole log is the job's artifact: aq job logs --stream stdout %s", lv.gaps, fo.id))
	case !lv.ended:
		fo.note(emit, "· the live log did not reach its end; the whole log is the job's artifact: aq job logs --stream stdout "+fo.id)
	}
}

// isRefused: the coordinator answered, with what aq cannot take (a 4xx,
// or a 2xx that is not the contract's).
func isRefused(err error) bool {
	var se *fleet.StatusError
	var ce *fleet.ContractError // an answer that is not the contract's JSON (a proxy's page)
	return errors.As(err, &se) || errors.As(err, &ce)
}

// feed renders b, the engine's output, line by line; a line's start waits
// for its end.
func (fo *follower) feed(b []byte, emit func(string)) {
	fo.partial = append(fo.partial, b...)
	for {
		i := bytes.IndexByte(fo.partial, '\n')
		if i < 0 {
			break
		}
		fo.line(fo.partial[:i], emit)
		fo.partial = fo.partial[i+1:]
	}
}

// flushPartial renders a last line without its newline.
func (fo *follower) flushPartial(emit func(string)) {
	if len(fo.partial) > 0 {
		fo.line(fo.partial, emit)
		fo.partial = nil
	}
}

// note emits a line that is not the engine's output: to meta when set
// (--raw keeps stdout to the engine's lines).
func (fo *follower) note(emit func(string), l string) {
	if fo.rec != nil {
		fo.rec(logRecord{Job: fo.id, Kind: "event", Text: l})
		return
	}
	if fo.meta != nil {
		fo.meta(l)
		return
	}
	emit(l)
}

// readLocal reads what the log gained since the last call; at the end
// (final) an unterminated last line too.
func (fo *follower) readLocal(emit func(string), final bool) {
	if fo.logPath == "" {
		return
	}
	f, err := os.Open(fo.logPath)
	if err != nil {
		return
	}
	defer f.Close()
	fo.sawLocal = true
	if _, err := f.Seek(fo.offset, io.SeekStart); err != nil {
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			fo.offset += int64(n)
			fo.feed(buf[:n], emit)
		}
		if err != nil {
			break
		}
	}
	if final {
		fo.flushPartial(emit)
	}
}

func (fo *follower) line(l []byte, emit func(string)) {
	if fo.raw {
		if !engines.IsHeader(l) {
			emit(string(bytes.TrimRight(l, "\r")))
		}
		return
	}
	for _, n := range fo.tr.Line(l) {
		if fo.rec != nil {
			fo.rec(logRecord{Job: fo.id, Kind: n.Kind, Text: n.Text, Usage: n.Usage})
			continue
		}
		emit(n.String())
	}
}

// readRemote renders the job's latest engine-stdout artifact.
func (fo *follower) readRemote(ctx context.Context, emit func(string)) {
	arts, err := fo.remote.JobArtifacts(ctx, fo.id)
	if err != nil {
		fo.note(emit, "! the engine's output is not available from the coordinator: "+err.Error())
		return
	}
	var pick *fleet.ArtifactDoc
	for i := range arts {
		if arts[i].Name == "engine-stdout" && (pick == nil || !arts[i].CreatedAt.Before(pick.CreatedAt)) {
			pick = &arts[i]
		}
	}
	if pick == nil {
		fo.note(emit, "· the coordinator holds no engine output for this job (it may not have run, or its factory has not uploaded it yet)")
		return
	}
	b, err := fo.remote.ArtifactContent(ctx, *pick)
	if err != nil {
		fo.note(emit, "! cannot read the engine output artifact "+pick.ID+": "+err.Error())
		return
	}
	fo.note(emit, fmt.Sprintf("· engine output of attempt %d, from factory %s (artifact %s%s)", pick.Attempt, orDash(pick.FactoryID), pick.ID, map[bool]string{true: ", truncated"}[pick.Truncated]))
	for _, l := range bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n")) {
		fo.line(l, emit)
	}
}

// ---- where the job is ----

// localWatch is a job of the local queue: its history, until it reaches a
// stage where it no longer runs on its own (review, testing, shipped,
// failed, dead_letter).
type localWatch struct {
	q    *queue.Queue
	id   string
	seen int // history entries already shown
	// behind counts the polls that saw an ended stage whose history did
	// not reach it yet (a move in progress: landedPolls).
	behind int
}

// landedPolls is how many polls a follower waits for a job's history to
// reach the ended stage its manifest already shows. A move in progress
// shows the new stage with the state from before it (queue.Get: the
// manifest's stage wins) for as long as the new sidecar takes to land;
// the follower ended on such a view without the job's last stage change
// (seen beside a CPU hog). A move that was interrupted never lands: the
// follower ends anyway after these polls (5 s at the default interval).
const landedPolls = 20

func (w *localWatch) Poll(context.Context) ([]string, bool, error) {
	e, err := w.q.Get(w.id)
	if err != nil {
		return nil, false, err
	}
	s := e.State
	var out []string
	for ; w.seen < len(s.History); w.seen++ {
		h := s.History[w.seen]
		out = append(out, stageLine(h.At, string(h.From), string(h.To), string(h.Reason), h.Detail))
	}
	ended := localEnded(s.Stage)
	if n := len(s.History); ended && n > 0 && s.History[n-1].To != s.Stage && w.behind < landedPolls {
		w.behind++
		ended = false
	}
	return out, ended, nil
}

// localEnded: the job no longer runs and will not run again without a
// person (a retry goes back to the inbox: that is not an end).
func localEnded(s job.Stage) bool {
	switch s {
	case job.Review, job.Testing, job.Shipped, job.Failed, job.DeadLetter:
		return true
	}
	return false
}

// fleetWatch is a fleet job at the coordinator: its events (or, on a
// coordinator without them, its stage) until a terminal stage.
type fleetWatch struct {
	c        *fleet.Client
	id       string
	seq      int64
	noEvents bool
	stage    string
}

func (w *fleetWatch) Poll(ctx context.Context) ([]string, bool, error) {
	j, err := w.c.Job(ctx, w.id)
	if err != nil {
		return nil, false, err
	}
	var out []string
	if !w.noEvents {
		evs, err := w.c.JobEvents(ctx, w.id)
		switch {
		case fleet.IsRouteAbsent(err):
			w.noEvents = true
			out = append(out, "· the coordinator has no GET /fleet/jobs/:id/events: only stage changes are shown")
		case err != nil:
			return nil, false, err
		}
		for _, e := range evs {
			if e.Seq <= w.seq {
				continue
			}
			w.seq = e.Seq
			what := e.Kind
			if e.Factory != "" {
				what += " by " + e.Factory
			}
			if e.Epoch > 0 {
				what += fmt.Sprintf(" (epoch %d)", e.Epoch)
			}
			out = append(out, stageLine(e.At, "", e.Stage, what, e.Detail))
		}
	}
	if w.noEvents && j.Stage != w.stage {
		out = append(out, stageLine(time.Now(), w.stage, j.Stage, j.Reason, j.Detail))
	}
	w.stage = j.Stage
	return out, fleetEnded(j.Stage), nil
}

// fleetEnded: the coordinator's stages after which nothing runs on its own.
func fleetEnded(stage string) bool {
	switch stage {
	case "review", "testing", "shipped", "failed", "dead_letter":
		return true
	}
	return false
}

// stageLine is a stage change for a person.
func stageLine(at time.Time, from, to, why, detail string) string {
	var b strings.Builder
	b.WriteString("◆ ")
	if !at.IsZero() {
		b.WriteString(at.Local().Format(time.TimeOnly) + " ")
	}
	switch {
	case from != "" && to != "":
		b.WriteString("stage " + from + " → " + to)
	case to != "":
		b.WriteString("stage " + to)
	}
	if why != "" {
		b.WriteString(": " + why)
	}
	if detail != "" {
		b.WriteString(" — " + detail)
	}
	return b.String()
}

// newFollower finds job id: in the local queue (local mode), or at the
// coordinator (fleet mode), reading its engine output from this host's log
// when it ran here. An unknown job is a usage error.
func newFollower(ctx context.Context, f *Factory, id string, raw bool) (*follower, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err
	}
	if err := checkJobID(id); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.LogsDir(), id, "stdout.log")
	if useFleet(cfg) {
		c, err := operatorClient(ctx, f)
		if err != nil {
			return nil, err
		}
		if _, err := c.Job(ctx, id); err != nil {
			return nil, jobOpError(id, "read", err)
		}
		fo := &follower{id: id, watch: &fleetWatch{c: c, id: id}, remote: c, raw: raw, every: time.Second}
		if ranHere(cfg.StateDir(), id) || exists(logPath) {
			fo.logPath = logPath
		} else {
			fo.live = &remoteLog{c: c}
		}
		return fo, nil
	}
	if _, err := jobEntry(f, id); err != nil {
		return nil, err
	}
	a, _ := f.Local()
	return &follower{id: id, watch: &localWatch{q: a.Queue, id: id}, logPath: logPath, raw: raw}, nil
}

// ranHere reports whether this factory has a record of job id.
func ranHere(stateDir, id string) bool {
	s, err := jobstate.Open(filepath.Join(stateDir, "jobs"))
	if err != nil {
		return false
	}
	_, err = s.Get(id)
	return err == nil
}

// checkJobID refuses an id that cannot name a job (and would escape the
// logs directory).
func checkJobID(id string) error {
	if msg := job.CheckID(id); msg != "" {
		return aqerr.Usagef("a job id is letters, digits, '.', '_' and '-' (`aq status` lists the jobs)", "%s is not a job id: it %s", job.Show(id), msg)
	}
	return nil
}
