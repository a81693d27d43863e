package cli

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
)

// progress shows a running job's usage: one live line on a terminal
// (rewritten in place), plain log lines at most every logEvery otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	log      *slog.Logger
	logEvery time.Duration
	now      func() time.Time

	mu      sync.Mutex
	start   map[string]time.Time
	lastLog map[string]time.Time
	round   map[string]string // the repair round a job is in ("" before one)
	drawn   bool
}

func newProgress(w io.Writer, tty bool, log *slog.Logger) *progress {
	return &progress{w: w, tty: tty, log: log, logEvery: 15 * time.Second, now: time.Now,
		start: map[string]time.Time{}, lastLog: map[string]time.Time{}, round: map[string]string{}}
}

// event is a runner.Options.OnEvent for job id.
func (p *progress) event(id string, e runner.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	switch e := e.(type) {
	case runner.EngineStarted:
		p.start[id] = now
	case runner.RepairStarted:
		// A line of its own, kept above the live one: the round and why.
		p.clear()
		how := "fresh, with the task and the failure"
		if e.Session != "" {
			how = "continuing its session"
		}
		if p.tty {
			fmt.Fprintf(p.w, "%s  repair %d/%d: verify %q exited %d; %s again, %s\n", id, e.Round, e.Of, e.Verify.Command, e.Verify.ExitCode, e.Engine, how)
		}
		p.log.Info("repair round", "job", id, "round", e.Round, "of", e.Of, "verify", e.Verify.Command, "exit", e.Verify.ExitCode, "session", e.Session)
		p.round[id] = fmt.Sprintf("  repair %d/%d", e.Round, e.Of)
	case runner.Progress:
		line := id + p.round[id] + "  " + engines.FormatProgress(e.Engine, e.Usage, now.Sub(p.start[id]))
		if p.tty {
			fmt.Fprintf(p.w, "\r\033[K%s", line)
			p.drawn = true
			return
		}
		if now.Sub(p.lastLog[id]) >= p.logEvery {
			p.lastLog[id] = now
			p.log.Info("progress", "job", id, "engine", e.Engine, "turns", e.Usage.Turns, "tokens", e.Usage.Tokens(), "cost_usd", e.Usage.CostUSD)
		}
	}
}

// done clears the live line before the job's result is printed.
func (p *progress) done(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.start, id)
	delete(p.lastLog, id)
	delete(p.round, id)
	p.clear()
}

// clear erases the live line; the caller holds mu.
func (p *progress) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}
