package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/aqfleet/aq/agent/config"
	boardui "github.com/aqfleet/aq/cmd/aq/board"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
)

// `aq status` reads: the local queue (with each running job's engine log,
// read as it grows), the daemon's status file, and in fleet mode the
// coordinator. One statusReader serves one snapshot, or every refresh of
// `--watch`, keeping what makes the next refresh cheap (log offsets, the
// coordinator's queue version) and what a coordinator that went away last
// said.
type statusReader struct {
	f      *Factory
	cfg    *config.Config
	logs   *liveLogs
	mu     sync.Mutex // one read at a time
	viewer *fleetViewer
	// viewErr is why there is no coordinator client (configuration).
	viewErr error
}

func newStatusReader(f *Factory) (*statusReader, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err
	}
	if _, err := f.Local(); err != nil {
		return nil, err
	}
	return &statusReader{f: f, cfg: cfg, logs: &liveLogs{m: map[string]*liveLog{}}}, nil
}

// read takes one snapshot.
func (r *statusReader) read(ctx context.Context, now time.Time) (*Board, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, _ := r.f.Local()
	b, err := buildBoard(ctx, r.f, a, r.cfg.Home, now)
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for i := range b.Running {
		rj := &b.Running[i]
		keep[rj.ID] = true
		r.enrich(rj.ID, rj.Attempt, &rj.Phase, &rj.Tokens, &rj.CostUSD, &rj.CostEstimated, &rj.LastEvent)
	}
	b.Pools = poolStatus(r.cfg.WorktreesDir())
	b.Fleet = fleetStatus(r.cfg, now)
	b.Daemon = daemonStatus(r.cfg)
	if d := b.Daemon; d != nil && d.Alive {
		for _, j := range d.Running {
			keep[j.JobID] = true
		}
		if d.Sandbox != nil {
			b.Sandbox = d.Sandbox // how the daemon runs engines, not this shell's AQ_SANDBOX
		}
	}
	if useFleet(r.cfg) {
		b.Coordinator = r.coordinator(ctx, now)
		for _, j := range b.Coordinator.Jobs {
			if j.Stage == "assigned" || j.Stage == "building" {
				keep[j.ID] = true
			}
		}
	}
	r.logs.prune(keep)
	return b, nil
}

// enrich fills a running job's phase, usage and last event from its engine
// log on this host.
func (r *statusReader) enrich(id string, attempt int, phase *string, tokens *int64, cost *float64, est *bool, last *string) bool {
	tr := r.logs.read(filepath.Join(r.cfg.LogsDir(), id, "stdout.log"), id)
	if tr == nil || (attempt > 0 && tr.Attempt() < attempt) {
		*phase = "preparing"
		return false
	}
	*phase = "engine"
	if r, n := tr.Round(); r > 0 {
		*phase = fmt.Sprintf("repair %d/%d", r, n) // a repair round after a failed verify
	}
	if tr.Ended() {
		*phase = "finishing"
	}
	if u, ok := tr.Usage(); ok {
		*tokens, *cost, *est = u.Tokens(), u.CostUSD, u.Estimated
	}
	*last = tr.Last()
	return true
}

// coordinator reads the fleet view (the viewer is built on first use).
func (r *statusReader) coordinator(ctx context.Context, now time.Time) *FleetView {
	if r.viewer == nil && r.viewErr == nil {
		c, err := operatorClient(ctx, r.f)
		if err != nil {
			r.viewErr = err
		} else {
			r.viewer = newFleetViewer(c)
		}
	}
	if r.viewErr != nil {
		return &FleetView{API: r.cfg.FleetAPI, Error: aqerr.Message(r.viewErr), UnreachableSince: now, Counts: map[string]int{},
			Jobs: []FleetViewJob{}, Factories: []FleetViewFactory{}, Alerts: []FleetAlert{}, Missing: []string{}}
	}
	return r.viewer.refresh(ctx, now)
}

// liveLogs reads running jobs' engine logs as they grow: each refresh
// reads only what was appended since the last.
type liveLogs struct {
	mu sync.Mutex
	m  map[string]*liveLog
}

type liveLog struct {
	off     int64
	partial []byte
	tr      *engines.Transcript
}

// read returns job id's transcript after reading what path gained; nil
// when there is no log (yet).
func (l *liveLogs) read(path, id string) *engines.Transcript {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	ll := l.m[id]
	if st, err := f.Stat(); err == nil && ll != nil && st.Size() < ll.off {
		ll = nil // rewritten: start again
	}
	if ll == nil {
		ll = &liveLog{tr: engines.NewTranscript("", "", nil)}
		l.m[id] = ll
	}
	if _, err := f.Seek(ll.off, io.SeekStart); err != nil {
		return ll.tr
	}
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			ll.off += int64(n)
			ll.partial = append(ll.partial, buf[:n]...)
			for {
				i := strings.IndexByte(string(ll.partial), '\n')
				if i < 0 {
					break
				}
				ll.tr.Line(ll.partial[:i])
				ll.partial = ll.partial[i+1:]
			}
		}
		if err != nil {
			break
		}
	}
	return ll.tr
}

// prune forgets the logs of jobs no longer running.
func (l *liveLogs) prune(keep map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.m {
		if !keep[id] {
			delete(l.m, id)
		}
	}
}

func usageCell(tokens int64, cost float64, est bool) string {
	if tokens == 0 && cost == 0 {
		return "-"
	}
	c := fmt.Sprintf("$%.4f", cost)
	if est {
		c = "~" + c
	}
	return fmt.Sprintf("%d tok %s", tokens, c)
}

// printCoordinator is the coordinator's section of plain `aq status`.
func printCoordinator(w io.Writer, v *FleetView) {
	if v == nil {
		return
	}
	fmt.Fprintf(w, "\ncoordinator %s", v.API)
	if !v.Reachable {
		fmt.Fprintf(w, ": UNREACHABLE since %s: %s\n", v.UnreachableSince.Local().Format(time.TimeOnly), v.Error)
		if v.FetchedAt.IsZero() {
			return
		}
		fmt.Fprintf(w, "  (what it said at %s)\n", v.FetchedAt.Local().Format(time.TimeOnly))
	} else {
		fmt.Fprintln(w)
	}
	var parts []string
	for _, s := range fleetStages {
		parts = append(parts, fmt.Sprintf("%s %d", s, v.Counts[s]))
	}
	fmt.Fprintln(w, "  "+strings.Join(parts, "  "))
	if len(v.Factories) > 0 {
		tw := table(w)
		fmt.Fprintln(tw, "  FACTORY\tHEALTH\tRUNNING\tLOAD\tHEARTBEAT")
		for _, f := range v.Factories {
			h := f.Health
			if f.Stale {
				h = "stale"
			}
			hb := "never"
			if f.HeartbeatAgeSec >= 0 {
				hb = fmt.Sprintf("%ds ago", f.HeartbeatAgeSec)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d/%d\t%.2f\t%s\n", f.ID, h, f.Running, f.SeatLimit, f.Load, hb)
		}
		tw.Flush()
	}
	for _, a := range v.Alerts {
		fmt.Fprintf(w, "  ! %s\n", a.Message)
	}
	for _, m := range v.Missing {
		fmt.Fprintf(w, "  (the coordinator has no %s)\n", m)
	}
}

// ---- --watch ----

func runWatch(ctx context.Context, f *Factory, opts *statusOptions) error {
	in, inOK := f.IO.In.(*os.File)
	tty := f.IO.OutTTY && inOK && term.IsTerminal(int(in.Fd()))
	if tty {
		// Logs would scribble over the full-screen board: what matters is
		// on the board itself.
		f.IO.Err = io.Discard
	}
	r, err := newStatusReader(f)
	if err != nil {
		return err
	}
	src := &boardSource{f: f, r: r}
	if tty {
		return boardui.Run(ctx, f.IO.In, f.IO.Out, boardui.Options{Source: src, Interval: opts.Interval, Plain: f.Plain()})
	}
	for {
		s := src.Snapshot(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fmt.Fprintf(f.IO.Out, "=== aq status at %s (every %s; Ctrl-C stops) ===\n%s\n", time.Now().Local().Format(time.DateTime), opts.Interval, boardui.Plain(s, opts.Interval, time.Now()))
		t := time.NewTimer(opts.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// boardSource is the board's Source over the status reader, the job
// actions and the log follower.
type boardSource struct {
	f *Factory
	r *statusReader
}

var _ boardui.Source = (*boardSource)(nil)

func (s *boardSource) Snapshot(ctx context.Context) *boardui.Snapshot {
	now := time.Now()
	b, err := s.r.read(ctx, now)
	if err != nil {
		return &boardui.Snapshot{At: now, Mode: "local", Where: s.r.cfg.Home, Err: aqerr.Message(err)}
	}
	return toSnapshot(b, s.r.cfg, now, s.r)
}

func (s *boardSource) Act(ctx context.Context, id, action string) (string, error) {
	msg, err := act(ctx, s.f, id, action, "")
	if err != nil {
		return "", errors.New(aqerr.Message(err))
	}
	return msg, nil
}

func (s *boardSource) Follow(ctx context.Context, id string, emit func(string)) error {
	fo, err := newFollower(ctx, s.f, id, false)
	if err != nil {
		return errors.New(aqerr.Message(err))
	}
	return fo.run(ctx, emit)
}

// toSnapshot turns the status into what the board shows: the local queue,
// or in fleet mode the coordinator's jobs (enriched from this host's logs
// for the jobs it runs), plus the daemon.
func toSnapshot(b *Board, cfg *config.Config, now time.Time, r *statusReader) *boardui.Snapshot {
	s := &boardui.Snapshot{At: now, Mode: "local", Where: b.Home}
	if len(b.Recovered) > 0 {
		s.Notes = append(s.Notes, "recovered (aq had died; checkpointed and requeued): "+strings.Join(b.Recovered, ", "))
	}
	if d := b.Daemon; d != nil {
		bd := &boardui.Daemon{FactoryID: d.FactoryID, Alive: d.Alive, Stage: string(d.Stage), Slots: d.Slots, Busy: d.Busy, Source: d.Source,
			Gate: d.Gate, Healthy: d.HeartbeatHealthy}
		if br := d.Broker; br != nil {
			bd.Broker = "healthy"
			if !br.Healthy {
				bd.Broker = "unhealthy"
				if br.Error != "" {
					bd.Broker += ": " + br.Error
				}
			}
		}
		if !d.LastHeartbeat.IsZero() {
			bd.HeartbeatAge = now.Sub(d.LastHeartbeat)
		}
		if !d.Alive {
			bd.Stopped = d.UpdatedAt
			if !d.StoppedAt.IsZero() {
				bd.Stopped = d.StoppedAt
			}
		}
		s.Daemon = bd
	}
	if sb := b.Sandbox; sb != nil {
		s.Sandbox = &boardui.Sandbox{Line: sb.Line(), Weak: sb.RunLevel() != sandbox.LevelFull}
	}
	if v := b.Coordinator; v != nil {
		return fleetSnapshot(s, b, v, cfg, now, r)
	}
	for _, st := range job.Stages {
		s.Stages = append(s.Stages, boardui.Count{Stage: string(st), N: b.Counts[st]})
	}
	for _, x := range b.Running {
		s.Running = append(s.Running, boardui.Row{ID: x.ID, Stage: string(job.Building), Repo: x.Repo, Engine: x.Engine, Phase: orDash(x.Phase),
			Elapsed: time.Duration(x.AgeSec) * time.Second, HasUsage: x.Tokens > 0 || x.CostUSD > 0, Tokens: x.Tokens, Cost: x.CostUSD,
			CostEstimated: x.CostEstimated, Last: x.LastEvent, Attempts: x.Attempt})
	}
	for _, x := range b.Runnable {
		last := "priority " + job.PriorityName(x.Priority)
		if x.Attempts > 0 {
			last += fmt.Sprintf(", %d attempt(s) so far", x.Attempts)
		}
		s.Runnable = append(s.Runnable, boardui.Row{ID: x.ID, Stage: string(job.Inbox), Repo: x.Repo, Engine: x.Engine, Last: last, Attempts: x.Attempts})
	}
	for _, x := range b.Waiting {
		s.Waiting = append(s.Waiting, boardui.Row{ID: x.ID, Stage: string(x.Stage), Last: x.Why})
	}
	for _, x := range b.Shipped {
		s.Shipped = append(s.Shipped, boardui.Row{ID: x.ID, Stage: string(job.Shipped), Repo: x.Repo, Last: strings.TrimSpace(x.Branch + " " + x.PR),
			Elapsed: now.Sub(x.EndedAt)})
	}
	for _, x := range b.Gate {
		s.Review = append(s.Review, boardui.Row{ID: x.ID, Stage: string(x.Stage), Repo: x.Repo, Last: strings.TrimSpace(x.Branch + " " + x.PR)})
	}
	for _, x := range b.Failed {
		last := string(x.Reason)
		if x.Detail != "" {
			last += ": " + x.Detail
		}
		s.Failed = append(s.Failed, boardui.Row{ID: x.ID, Stage: string(x.Stage), Last: last, Attempts: x.Attempts})
	}
	return s
}

func fleetSnapshot(s *boardui.Snapshot, b *Board, v *FleetView, cfg *config.Config, now time.Time, r *statusReader) *boardui.Snapshot {
	s.Mode, s.Where = "fleet", "coordinator "+v.API
	bf := &boardui.Fleet{API: v.API, Reachable: v.Reachable, UnreachableSince: v.UnreachableSince, Error: v.Error, FetchedAt: v.FetchedAt,
		FactoriesKnown: !slices.Contains(v.Missing, "GET /fleet/factories"), Missing: v.Missing, Requests: v.Requests}
	for _, f := range v.Factories {
		bf.Factories = append(bf.Factories, boardui.Factory{ID: f.ID, Health: f.Health, Stale: f.Stale, Running: f.Running, Seats: f.SeatLimit,
			Load: f.Load, HeartbeatAge: time.Duration(f.HeartbeatAgeSec) * time.Second, Jobs: f.Jobs, Version: f.Version}) // -1s: never
	}
	for _, a := range v.Alerts {
		bf.Alerts = append(bf.Alerts, a.Message)
	}
	s.Fleet = bf
	for _, st := range fleetStages {
		s.Stages = append(s.Stages, boardui.Count{Stage: st, N: v.Counts[st]})
	}
	here := map[string]string{} // jobs this host's daemon runs → phase
	if d := b.Daemon; d != nil && d.Alive {
		for _, j := range d.Running {
			here[j.JobID] = j.Phase
		}
	}
	for _, j := range v.Jobs {
		row := boardui.Row{ID: j.ID, Stage: j.Stage, Repo: j.Repo, Engine: j.Engine, Factory: j.Factory, Attempts: j.Attempts,
			Elapsed: time.Duration(j.AgeSec) * time.Second}
		switch j.Stage {
		case "assigned", "building":
			row.Phase = j.Stage
			if ph, ok := here[j.ID]; ok {
				row.Phase = ph
			}
			var phase, last string
			var tokens int64
			var cost float64
			var est bool
			if r != nil && r.enrich(j.ID, j.Attempts, &phase, &tokens, &cost, &est, &last) {
				row.Phase, row.Last = phase, last
				row.HasUsage, row.Tokens, row.Cost, row.CostEstimated = tokens > 0 || cost > 0, tokens, cost, est
			}
			s.Running = append(s.Running, row)
		case "queued", "blocked":
			row.Last = j.Why
			s.Waiting = append(s.Waiting, row)
		case "review", "testing":
			s.Review = append(s.Review, row)
		case "shipped":
			s.Shipped = append(s.Shipped, row)
		case "failed", "dead_letter":
			row.Last = j.Reason
			if j.Detail != "" {
				row.Last += ": " + j.Detail
			}
			s.Failed = append(s.Failed, row)
		}
	}
	sort.SliceStable(s.Failed, func(a, c int) bool { return s.Failed[a].Elapsed < s.Failed[c].Elapsed }) // recent first
	sort.SliceStable(s.Shipped, func(a, c int) bool { return s.Shipped[a].Elapsed < s.Shipped[c].Elapsed })
	if len(s.Shipped) > shippedShown {
		s.Shipped = s.Shipped[:shippedShown]
	}
	_ = cfg
	return s
}
