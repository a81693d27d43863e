package cli

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/x/ansi"
	"golang.org/x/term"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/job"
)

// progress shows running jobs. On a terminal (live) it draws one block,
// a line per running job — the job, its stage, the engine's last note
// (from the same transcript `aq job logs -f` reads), turns, tokens, cost
// and elapsed time — rewritten in place as the job moves, and it is the
// writer of everything else aq prints on stderr meanwhile (log lines,
// results), which it prints above the block so the screen never garbles.
// Without a terminal it writes plain log lines at most every logEvery.
type progress struct {
	w        io.Writer
	tty      bool
	log      *slog.Logger
	logEvery time.Duration
	now      func() time.Time
	// width is the terminal's columns (live); logPath the engine log a
	// job's last note is read from ("": none).
	width   func() int
	logPath func(id string) string
	logs    *liveLogs

	mu      sync.Mutex
	order   []string // running jobs, in the order they started
	jobs    map[string]*liveJob
	lastLog map[string]time.Time
	drawn   []string // the block's lines as last drawn
	drawnW  int      // the width they were drawn at
	mid     bool     // a write left the cursor mid-line: draw after its newline
	stopped bool

	tick chan struct{}
	wg   sync.WaitGroup
}

// liveJob is one running job as the block shows it.
type liveJob struct {
	stage    string
	engine   string
	round    string // "repair k/n" during a repair round
	usage    engines.Usage
	hasUsage bool
	start    time.Time
}

func newProgress(w io.Writer, tty bool, log *slog.Logger) *progress {
	return &progress{w: w, tty: tty, log: log, logEvery: 15 * time.Second, now: time.Now,
		width: func() int { return 80 }, jobs: map[string]*liveJob{}, lastLog: map[string]time.Time{}}
}

// newLive is the terminal's progress: the block on w, width from the
// terminal w is (80 when it cannot tell), notes from the engine logs under
// logsDir. start begins its clock and resize redraws; stop ends them.
func newLive(w io.Writer, logsDir string) *progress {
	p := newProgress(w, true, slog.New(slog.DiscardHandler))
	if f, ok := w.(*os.File); ok {
		p.width = func() int {
			if c, _, err := term.GetSize(int(f.Fd())); err == nil && c > 0 {
				return c
			}
			return 80
		}
	}
	p.logs = &liveLogs{m: map[string]*liveLog{}}
	p.logPath = func(id string) string { return filepath.Join(logsDir, id, "stdout.log") }
	return p
}

// start redraws the block every second (elapsed time, the engine's last
// note) and when the terminal is resized, until stop.
func (p *progress) start() {
	p.tick = make(chan struct{})
	resize := make(chan os.Signal, 1)
	stopResize := notifyResize(resize)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer stopResize()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.tick:
				return
			case <-t.C:
			case <-resize:
			}
			p.mu.Lock()
			p.redraw()
			p.mu.Unlock()
		}
	}()
}

// stop ends the clock and erases the block: nothing of it is left on the
// terminal (a job's end, Ctrl-C).
func (p *progress) stop() {
	if p.tick != nil {
		close(p.tick)
		p.wg.Wait()
		p.tick = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	p.stopped = true
}

// Write prints b above the block (log lines, a result): the block is
// erased, b written, the block drawn again below it.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	n, err := p.w.Write(b)
	p.mid = len(b) > 0 && !bytes.HasSuffix(b, []byte("\n"))
	p.draw()
	return n, err
}

// event is a runner.Options.OnEvent for job id.
func (p *progress) event(id string, e runner.Event) {
	var logs []func()
	p.mu.Lock()
	now := p.now()
	j := p.jobs[id]
	if j == nil {
		j = &liveJob{stage: "preparing", start: now}
		p.jobs[id] = j
		p.order = append(p.order, id)
	}
	switch e := e.(type) {
	case runner.Preparing:
		j.stage = "preparing"
	case runner.EngineStarted:
		j.stage, j.engine = "engine", e.Engine
	case runner.Checkpointed:
		j.stage = "checkpoint"
	case runner.VerifyStarted:
		j.stage = "verify"
	case runner.Shipping:
		j.stage = "shipping"
	case runner.RepairStarted:
		// A line of its own, kept above the block: the round and why.
		how := "fresh, with the task and the failure"
		if e.Session != "" {
			how = "continuing its session"
		}
		j.round = fmt.Sprintf("repair %d/%d", e.Round, e.Of)
		j.stage = j.round
		if p.tty {
			p.clear()
			fmt.Fprintf(p.w, "%s  repair %d/%d: verify %q exited %d; %s again, %s\n", id, e.Round, e.Of, e.Verify.Command, e.Verify.ExitCode, e.Engine, how)
		}
		logs = append(logs, func() {
			p.log.Info("repair round", "job", id, "round", e.Round, "of", e.Of, "verify", e.Verify.Command, "exit", e.Verify.ExitCode, "session", e.Session)
		})
	case runner.Progress:
		if j.stage == "checkpoint" || j.stage == "preparing" {
			j.stage = "engine"
			if j.round != "" {
				j.stage = j.round
			}
		}
		j.engine, j.usage, j.hasUsage = e.Engine, e.Usage, true
		if !p.tty && now.Sub(p.lastLog[id]) >= p.logEvery {
			p.lastLog[id] = now
			logs = append(logs, func() {
				p.log.Info("progress", "job", id, "engine", e.Engine, "turns", e.Usage.Turns, "tokens", e.Usage.Tokens(), "cost_usd", e.Usage.CostUSD)
			})
		}
	}
	if p.tty {
		p.redraw()
	}
	p.mu.Unlock()
	// The logger may write through p (live): after the lock.
	for _, l := range logs {
		l()
	}
}

// done forgets a job whose result is about to be printed: its line leaves
// the block.
func (p *progress) done(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.jobs, id)
	delete(p.lastLog, id)
	for i, o := range p.order {
		if o == id {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
	if p.logs != nil {
		p.logs.prune(p.running())
	}
	p.redraw()
}

// running is the set of running jobs' ids; the caller holds mu.
func (p *progress) running() map[string]bool {
	keep := map[string]bool{}
	for id := range p.jobs {
		keep[id] = true
	}
	return keep
}

// redraw replaces the block with the jobs' current lines; the caller holds
// mu.
func (p *progress) redraw() {
	if !p.tty || p.stopped || p.mid {
		return
	}
	lines := p.lines(p.width())
	if slices.Equal(lines, p.drawn) && p.drawnW == p.width() {
		return
	}
	p.clear()
	p.draw()
}

// draw writes the block below the cursor; the caller holds mu.
func (p *progress) draw() {
	if !p.tty || p.stopped || p.mid {
		return
	}
	w := p.width()
	lines := p.lines(w)
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	if b.Len() > 0 {
		fmt.Fprint(p.w, b.String())
	}
	p.drawn, p.drawnW = lines, w
}

// clear erases the block: up to its first line, then to the end of the
// screen. A line drawn wider than the terminal is now (a resize to fewer
// columns) takes as many rows as it wraps to; the caller holds mu.
func (p *progress) clear() {
	if len(p.drawn) == 0 || p.mid {
		return
	}
	w := max(p.width(), 1)
	rows := 0
	for _, l := range p.drawn {
		rows += max(1, (ansi.StringWidth(l)+w-1)/w)
	}
	fmt.Fprintf(p.w, "\r\033[%dA\033[J", rows)
	p.drawn = nil
}

// lines are the block's lines at width columns, one per running job.
func (p *progress) lines(width int) []string {
	var out []string
	now := p.now()
	for _, id := range p.order {
		j := p.jobs[id]
		note := ""
		if p.logs != nil && p.logPath != nil {
			if tr := p.logs.read(p.logPath(id), id); tr != nil {
				note = job.Printable(tr.Last(), false)
			}
		}
		out = append(out, liveLine(id, j, note, now.Sub(j.start), width))
	}
	return out
}

// liveLine is one job's line, at most width-1 columns (the last column
// left free so the terminal never wraps it): the job and its stage always;
// the usage and elapsed time, then the engine's last note, as room allows.
func liveLine(id string, j *liveJob, note string, elapsed time.Duration, width int) string {
	room := max(width-1, 1)
	head := id + "  " + j.stage
	tail := shortDuration(elapsed)
	if j.hasUsage {
		cost := fmt.Sprintf("$%.4f", j.usage.CostUSD)
		if j.usage.Estimated {
			cost = "~" + cost
		}
		turns := fmt.Sprintf("%d turns", j.usage.Turns)
		if j.usage.Turns == 1 {
			turns = "1 turn"
		}
		tail = fmt.Sprintf("%s  %s tok  %s  %s", turns, shortCount(j.usage.Tokens()), cost, tail)
	}
	line := head + "  " + tail
	if ansi.StringWidth(line) > room {
		// Too narrow for everything: the job and stage, then what fits.
		return ansi.Truncate(line, room, "…")
	}
	if note != "" {
		if left := room - ansi.StringWidth(line) - 2; left >= 8 {
			line = head + "  " + ansi.Truncate(note, left, "…") + "  " + tail
		}
	}
	return line
}

func shortDuration(d time.Duration) string {
	d = d.Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%ds", int(d.Seconds()))
	}
	if d < time.Hour {
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func shortCount(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprintf("%d", n)
	case n < 1_000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1fM", float64(n)/1e6)
}
