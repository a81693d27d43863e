package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Limits end a daemon on its own, for factories that are started for a
// while rather than for ever — replicas a scaler starts on broker depth
// (buildkite-agent's --disconnect-after-idle-timeout and
// --disconnect-after-uptime, actions/runner's ephemeral mode). Reaching one
// drains: no new work, running jobs finish and are reported, Run returns nil
// (exit 0). Zero values are off.
type Limits struct {
	// IdleTimeout: drain once no job has run or arrived for this long.
	IdleTimeout time.Duration
	// MaxJobs: drain once this many jobs have started.
	MaxJobs int
	// MaxUptime: drain this long after the start.
	MaxUptime time.Duration
}

// Check says what is wrong with l, or nil.
func (l Limits) Check() error {
	switch {
	case l.IdleTimeout < 0:
		return fmt.Errorf("--idle-timeout %s is negative (use 0 for no limit)", l.IdleTimeout)
	case l.MaxUptime < 0:
		return fmt.Errorf("--max-uptime %s is negative (use 0 for no limit)", l.MaxUptime)
	case l.MaxJobs < 0:
		return fmt.Errorf("--max-jobs %d is negative (use 0 for no limit)", l.MaxJobs)
	}
	return nil
}

// limitReached drains the daemon because of limit, once.
func (d *Daemon) limitReached(limit, detail string) {
	d.log.Info("limit reached: draining, then exiting", "limit", limit, "detail", detail)
	d.Drain()
}

// jobStarted counts a job that starts (not one given back at a drain), and
// drains at MaxJobs.
func (d *Daemon) jobStarted() {
	d.mu.Lock()
	d.started++
	n := d.started
	d.lastBusy = time.Now()
	d.mu.Unlock()
	if max := d.o.Limits.MaxJobs; max > 0 && n >= max {
		d.limitReached("max-jobs", fmt.Sprintf("%d of %d jobs started", n, max))
	}
}

// watchLimits runs the time limits until ctx ends.
func (d *Daemon) watchLimits(ctx context.Context, wg *sync.WaitGroup) {
	l := d.o.Limits
	if l.MaxUptime > 0 {
		t := time.AfterFunc(l.MaxUptime, func() { d.limitReached("max-uptime", "up "+l.MaxUptime.String()) })
		context.AfterFunc(ctx, func() { t.Stop() })
	}
	if l.IdleTimeout <= 0 {
		return
	}
	tick := min(l.IdleTimeout/4, time.Second)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			d.mu.Lock()
			if len(d.running) > 0 {
				d.lastBusy = now
			}
			idle := now.Sub(d.lastBusy)
			d.mu.Unlock()
			if idle >= l.IdleTimeout {
				d.limitReached("idle-timeout", "idle for "+idle.Round(time.Millisecond).String())
				return
			}
		}
	}()
}
