package fleet

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// ErrNoJob: the coordinator has no job for this factory now (a 204).
var ErrNoJob = errors.New("no runnable job in the fleet")

// Agent is one fleet factory's pieces, wired: the client, heartbeats, the
// poll path, the reporter with its spool, and the job runner. Start enrolls
// and starts the background loops; Run is `aq run [--once|--drain]` in fleet
// mode. A daemon (or a broker receiver) can use the pieces directly.
type Agent struct {
	Client    *Client
	Heartbeat *Heartbeater
	Poller    *Poller
	Reporter  *Reporter
	// Artifacts uploads jobs' logs; its Reporter drains the artifact
	// spool. Nil: no uploads.
	Artifacts *Artifacts
	Jobs      *JobRunner
	Running   *Running
	// Host detects this host's capabilities and repos.
	Host func(ctx context.Context) (*caps.Host, error)
	// Caps keeps the offer current while the agent runs (nil: fixed at
	// start).
	Caps   *Refresher
	Enroll EnrollOptions
	// LocksDir holds the per-job flocks (config.LocksDir): `aq run` takes
	// its job's, as `aq daemon` does, so a daemon starting on the same
	// AQ_HOME never takes the running job for an orphan.
	LocksDir string
	Log      *slog.Logger
}

// Session is a started Agent: its heartbeat and spool-drain loops run until
// Stop. Its context is cancelled, with the *AuthError as the cause, when the
// coordinator refuses this factory's credentials; jobs run under it.
type Session struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	Creds  *Credentials
	Host   *caps.Host
}

// Context is the session's context.
func (s *Session) Context() context.Context { return s.ctx }

// Err is why the session ended on its own (an *AuthError), or nil.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	if c := context.Cause(s.ctx); IsAuth(c) {
		return c
	}
	return nil
}

// Stop ends the background loops and waits for them.
func (s *Session) Stop() {
	s.cancel(nil)
	s.wg.Wait()
}

// Start detects the host, enrolls (or loads the stored credentials), sends
// the first heartbeat (a 401/403 is returned: the fleet path must not start),
// drains the report spool once, and starts the heartbeat and drain loops.
func (a *Agent) Start(ctx context.Context) (*Session, error) {
	host, err := a.Host(ctx)
	if err != nil {
		return nil, err
	}
	caps.LogEngines(a.log(), host)
	engines := make([]string, 0, len(host.Engines))
	for _, e := range host.Engines {
		if e.Refused == "" {
			engines = append(engines, e.Name)
		}
	}
	a.Client.SetOffer(host.Tokens(), host.Repos)
	if a.Caps != nil {
		a.Caps.Start(host)
	}
	eo := a.Enroll
	hn, _ := os.Hostname()
	eo.Request = EnrollRequest{FactoryID: a.Client.FactoryID(), Hostname: hn, Capabilities: host.Tokens(), Repos: nonNil(host.Repos),
		Engines: engines, SeatLimit: max(a.Heartbeat.SeatLimit, 1), Version: a.Heartbeat.Version, Pool: a.Heartbeat.Pool}
	if eo.Log == nil {
		eo.Log = a.log()
	}
	creds, err := EnsureEnrolled(ctx, a.Client, eo)
	if err != nil {
		return nil, err
	}
	if err := a.Heartbeat.Beat(ctx); err != nil {
		if IsAuth(err) || IsRouteAbsent(err) {
			return nil, err // the fleet path cannot start: fix the token, or AQ_FLEET_API
		}
		a.log().Warn("first heartbeat failed; the heartbeat loop keeps trying", "err", err)
	}
	if a.Reporter.Spool.Depth() > 0 {
		res, err := a.Reporter.Drain(ctx)
		if IsAuth(err) {
			return nil, err
		}
		a.log().Info("report spool drained at start-up", "delivered", res.Delivered, "fenced", res.Fenced, "rejected", res.Rejected, "left", res.Left, "err", err)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	s := &Session{ctx: sctx, cancel: cancel, Creds: creds, Host: host}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := a.Heartbeat.Run(sctx); err != nil {
			cancel(err)
		}
	}()
	go func() {
		defer s.wg.Done()
		a.Reporter.Run(sctx)
	}()
	if a.Artifacts != nil {
		// Uploads left from earlier runs go in the background, first at once.
		if a.Artifacts.Reporter.Spool.Depth() > 0 {
			a.Artifacts.Reporter.Kick()
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			a.Artifacts.Reporter.Run(sctx)
		}()
	}
	return s, nil
}

// RunOptions are `aq run`'s modes.
type RunOptions struct {
	Once  bool // one claim; a job or ErrNoJob, never a second claim
	Drain bool // claim until the coordinator has nothing, then return
	// JobID accepts that one job (POST /fleet/accept, as a broker message
	// would) instead of claiming, runs it and returns: a controller that
	// starts one replica per job names it (`aq run --job ID`). A 409 (the
	// job is another factory's) or 404 (no such job to accept) is returned.
	JobID string
}

// Run is `aq run` in fleet mode: start, then take jobs one at a time (poll
// path, gated when configured) and run each through the JobRunner, calling
// onResult after each. It returns ErrNoJob when Once (or Drain) found
// nothing, the *AuthError when the coordinator refused the credentials, and
// nil when ctx ended.
func (a *Agent) Run(ctx context.Context, o RunOptions, onResult func(*Result)) error {
	s, err := a.Start(ctx)
	if err != nil {
		return err
	}
	defer s.Stop()
	ran := 0
	for {
		if a.Poller != nil && a.Poller.Ready != nil {
			// A host that cannot write $AQ_HOME takes no job: it could only
			// fail host_unavailable.
			if err := a.Poller.Ready(); err != nil {
				return err
			}
		}
		var c *Claim
		switch {
		case o.JobID != "":
			c, err = a.Client.Accept(s.ctx, o.JobID)
			if err == nil {
				c.Source = "job"
			}
		case o.Once || o.Drain:
			c, err = a.Client.Claim(s.ctx, false)
			if err == nil && c == nil {
				if o.Once || ran == 0 {
					return ErrNoJob
				}
				return nil
			}
		default:
			c, err = a.Poller.Next(s.ctx)
		}
		if err != nil {
			if serr := s.Err(); serr != nil {
				return serr
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		unlock := a.LockJob(c.Job.ID)
		res := a.Jobs.Run(s.ctx, c)
		unlock()
		ran++
		if onResult != nil {
			onResult(res)
		}
		if res.Err != nil {
			return res.Err
		}
		if serr := s.Err(); serr != nil {
			return serr
		}
		if o.Once || o.JobID != "" || ctx.Err() != nil {
			return nil
		}
	}
}

// LockJob takes job id's flock for as long as this process runs it (`aq
// run` and `aq daemon` alike). The coordinator leased the job to this
// factory, so a lock it cannot take is logged, not fatal.
func (a *Agent) LockJob(id string) (unlock func()) {
	if a.LocksDir == "" || !job.ValidID(id) {
		return func() {} // an id that is not one is refused by the job runner's admission
	}
	l, ok, err := worktree.TryLockJob(a.LocksDir, id)
	switch {
	case err != nil:
		a.log().Warn("cannot take the job's lock; running it without", "job", id, "err", err)
	case !ok:
		a.log().Warn("another aq process on this AQ_HOME holds the job's lock; running it anyway (the coordinator leased it to this factory)", "job", id)
	default:
		return func() { _ = l.Unlock() }
	}
	return func() {}
}

func (a *Agent) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.New(slog.DiscardHandler)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
