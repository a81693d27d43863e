// Package process owns how aq runs an engine as an operating-system process:
// its own process group, the environment tag that marks every descendant with
// the job id, stdin/stdout/stderr plumbing, the kill ladder on cancellation
// (SIGINT → grace → SIGTERM → grace → SIGKILL, to the whole group), and the
// clean-up after the engine exits: whatever is left of its group, and any
// tagged process that escaped the group, is killed before Run returns
// (docs/architecture.md, "Running a job").
//
// It is a leaf package: the job runner calls Run; engines only build a Spec.
//
// Platforms (files named for them): on Linux (proc_linux.go) tagged
// processes are found through /proc/<pid>/environ and the group leader is
// waited for without being reaped, so the group id cannot be reused while
// it is killed. On macOS (proc_darwin.go) they are found through sysctl
// kern.procargs2 (the caller's own processes, all of them for root), and
// the group is killed after the leader is reaped. Both share the sweep
// (sweep_unix.go) and the POSIX ladder (process_unix.go). On Windows
// (process_windows.go) an engine runs in a Job Object that kills the whole
// tree when it closes — with Run, or with aq however it dies — and the
// ladder is CTRL_BREAK then TerminateJobObject; there is no sweep by tag.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// TagEnv is the environment variable that carries the job id into the engine
// and everything it starts.
const TagEnv = "AQ_JOB_ID"

// DefaultGrace is the wait between two steps of the kill ladder.
const DefaultGrace = 3 * time.Second

// Spec is one process to run.
type Spec struct {
	Path string   // the program; a name without a slash is looked up in aq's own PATH
	Args []string // arguments, without the program name
	Dir  string   // working directory; "" is aq's

	// Env is the complete environment (KEY=VALUE). Nothing is inherited: nil
	// means an environment holding only the tag. Callers pass
	// secrets.EngineEnv(os.Environ(), ...). Run replaces any TagEnv entry with
	// TagEnv=Tag and never modifies the slice.
	Env []string

	// Stdin is copied into the child's stdin, which is then closed, so an
	// engine that reads until EOF (codex exec) does not hang. nil means
	// /dev/null. It must reach EOF or error (a strings.Reader with the prompt
	// is typical): Run waits for the copy to end. A child that exits without
	// reading it is fine.
	Stdin io.Reader

	// Stdout and Stderr receive the child's output as it is produced, so
	// callers can parse JSONL events live. nil discards. When they are the
	// same comparable writer, at most one write runs at a time. An *os.File
	// is handed to the child as is.
	Stdout, Stderr io.Writer

	// Tag is the job id, required, and must be unique among running jobs:
	// after the child exits, every process carrying it is killed. Every
	// process started from the child inherits TagEnv=Tag unless it scrubs
	// its environment; that is how FindTagged and KillTagged find what
	// escaped the process group.
	Tag string

	// Scope, when set, is added as ScopeEnv=Scope and limits the post-run
	// sweep to processes carrying it too: the aq home that started the job.
	// Job ids are unique per home, not per host.
	Scope string

	// Grace is the wait between ladder steps and before escaped processes
	// get SIGKILL; 0 means DefaultGrace.
	Grace time.Duration

	// Supervisor, when set, is the executable Run starts beside the child to
	// stop it if aq dies first (supervise.go): aq itself, which calls
	// MaybeSupervise at start. "" runs the child unsupervised.
	Supervisor string

	// Jail, when set, starts the child inside a sandbox (internal/sandbox),
	// which may run it under an init of its own: Run then waits for and
	// signals that init, which forwards the ladder's signals and reports
	// how the child ended. A jail that ends everything it runs when aq
	// dies (Supervises) makes Supervisor unnecessary. nil: no sandbox.
	Jail Jail

	// WaitDelay bounds how long Run waits, after the child exited and its
	// group and tagged processes were killed, for the stdio pipes to close
	// (a process outside the group and without the tag may hold them);
	// see exec.Cmd.WaitDelay. 0 means 2*Grace.
	WaitDelay time.Duration
}

// Result is how a process ended. Its fields are valid whenever Run returned
// a nil error.
type Result struct {
	Pid      int    // the child's pid, which is also its process group id
	ExitCode int    // the exit status; -1 if a signal ended the process
	Signal   string // the signal that ended it ("SIGTERM"), or ""

	// Stopped says the kill ladder ran because ctx was done; StopCause is
	// then context.Cause(ctx) (the runner cancels with causes such as
	// "timeout" or "budget_exceeded"). LadderStep is the last signal the
	// ladder sent to the group: "SIGINT", "SIGTERM" or "SIGKILL".
	Stopped    bool
	StopCause  error
	LadderStep string

	// Escaped counts the tagged processes outside the child's process group
	// (a setsid'd child, an MCP server) that were still alive after the
	// child exited, and that Run killed.
	Escaped int

	// Warning reports what went wrong after the start without changing how
	// the process ended: copying stdin/stdout/stderr failed, or the pipes
	// were still held open after WaitDelay (errors.Is(w, exec.ErrWaitDelay)),
	// or tagged processes could not be found or killed. As with os/exec,
	// copy errors are only reported when the process exited 0: otherwise
	// its own failure is the news.
	Warning error

	Duration time.Duration // from start until everything was reaped

	// OOM says the kernel killed a process of the run for memory: the
	// jail's cgroup memory limit (Spec.Jail) was reached.
	OOM bool
}

// Jail is a sandbox a process is started in (internal/sandbox implements
// it; Spec.Jail).
type Jail interface {
	// Start starts cmd inside the sandbox. It may rewrite cmd first (to
	// start the sandbox's init, which runs cmd's program in turn); Run
	// then waits for and signals the process Start started. An error
	// means nothing of cmd runs, and nothing the jail started is left.
	Start(cmd *exec.Cmd) (Jailed, error)
	// Supervises reports that the jail itself ends everything it runs when
	// aq dies, so Run starts no supervisor.
	Supervises() bool
}

// Jailed is one process started by a Jail.
type Jailed interface {
	// Exit says how the program itself ended, given how the process Start
	// started ended (an init reports its program's end): the exit status,
	// -1 for a signal, and the signal's name.
	Exit(st *os.ProcessState) (code int, signal string)
	// Close releases what the jail held once every process of the run is
	// gone, and reports whether the kernel killed one of them for memory.
	Close() (oom bool, err error)
}

var errNoTag = errors.New("process: a tag (the job id) is required")

// Run starts s in its own process group and waits until it has exited, the
// rest of its group has been killed, tagged processes that escaped the group
// have been killed, and its output has been copied.
//
// When ctx is done while the child runs, Run sends SIGINT to the group, waits
// s.Grace, sends SIGTERM, waits s.Grace, and sends SIGKILL, stopping as soon
// as the child exits. Once the child has exited (by itself or not), the group
// gets SIGKILL and tagged processes outside it get SIGTERM, then SIGKILL
// after s.Grace. On Linux, Run does not return before all of them are gone
// (zombies aside), so a checkpoint taken afterwards sees no more writes from
// the job; it gives up on a process that outlives SIGKILL by seconds and says
// so in Result.Warning.
//
// Run returns an error only when the process could not be started: ctx is
// already done, Tag is empty, or the start failed (errors.Is works with
// exec.ErrNotFound, fs.ErrNotExist, fs.ErrPermission). A non-zero exit is
// not an error. Run is safe for concurrent use.
func Run(ctx context.Context, s Spec) (Result, error) {
	if s.Tag == "" {
		return Result{}, errNoTag
	}
	if strings.ContainsRune(s.Tag, 0) {
		return Result{}, fmt.Errorf("process: tag %q holds a NUL byte", s.Tag)
	}
	if ctx.Err() != nil {
		err := ctx.Err()
		if c := context.Cause(ctx); c != err {
			err = fmt.Errorf("%w: %w", err, c)
		}
		return Result{}, fmt.Errorf("process: %s not started: %w", s.Path, err)
	}
	grace := s.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	waitDelay := s.WaitDelay
	if waitDelay <= 0 {
		waitDelay = 2 * grace
	}

	cmd := exec.Command(s.Path, s.Args...)
	cmd.Dir = s.Dir
	cmd.Env = withTag(s.Env, s.Tag, s.Scope)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.Stdin, s.Stdout, s.Stderr
	inNewGroup(cmd)
	cmd.WaitDelay = waitDelay

	// The supervisor first: there is no instant in which the engine runs
	// and an aq that dies leaves it unwatched.
	var sup *supervisor
	if s.Supervisor != "" && (s.Jail == nil || !s.Jail.Supervises()) {
		var err error
		if sup, err = startSupervisor(s.Supervisor, supervision{Tag: s.Tag, Scope: s.Scope, Grace: grace}); err != nil {
			return Result{}, fmt.Errorf("process: %s not started: %w", s.Path, err)
		}
		defer sup.done()
	}

	start := time.Now()
	var jailed Jailed
	if s.Jail != nil {
		j, err := s.Jail.Start(cmd)
		if err != nil {
			return Result{}, fmt.Errorf("process: start %s: %w", s.Path, err)
		}
		jailed = j
	} else if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("process: start %s: %w", s.Path, err)
	}
	pgid := cmd.Process.Pid // the child leads its new group
	g, err := holdGroup(cmd)
	if err != nil { // the child runs outside the group aq could kill: stop it
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if jailed != nil {
			_, _ = jailed.Close()
		}
		return Result{}, fmt.Errorf("process: start %s: %w", s.Path, err)
	}
	defer g.close()
	if sup != nil {
		sup.watch(pgid)
	}

	exited := make(chan struct{})
	var lad ladder
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lad.run(ctx, g, ladderSteps, grace, exited)
	}()

	// Where the platform allows it, wait for the leader to exit without
	// reaping it: as a zombie it keeps its pid, so the group id cannot be
	// reused by an unrelated process while the group is being killed, and
	// group members holding the stdout pipe die before Wait waits for it.
	var waitErr error
	reaped := !waitExited(pgid)
	if reaped {
		waitErr = cmd.Wait()
	}
	close(exited)
	wg.Wait() // the ladder sends nothing more

	g.kill() // the rest of the group, if any
	escaped, sweepErr := sweep(context.WithoutCancel(ctx), wants(s.Tag, s.Scope), grace, pgid)
	if errors.Is(sweepErr, errors.ErrUnsupported) {
		sweepErr = nil
	}
	if !reaped {
		waitErr = cmd.Wait()
	}

	res := Result{
		Pid:        pgid,
		ExitCode:   -1,
		Stopped:    lad.step != "",
		LadderStep: lad.step,
		Escaped:    escaped,
		Duration:   time.Since(start),
	}
	if res.Stopped {
		res.StopCause = causeOf(ctx)
	}
	if st := cmd.ProcessState; st != nil {
		res.ExitCode = st.ExitCode()
		res.Signal = exitSignal(st)
		if jailed != nil {
			res.ExitCode, res.Signal = jailed.Exit(st)
		}
	}
	var jailErr error
	if jailed != nil {
		res.OOM, jailErr = jailed.Close()
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		waitErr = fmt.Errorf("process: %s (pid %d): %w", s.Path, pgid, waitErr)
	} else {
		waitErr = nil
	}
	res.Warning = errors.Join(waitErr, sweepErr, jailErr)
	return res, nil
}

// causeOf is context.Cause, falling back to ctx.Err() (they are the same
// unless the context was cancelled with a cause).
func causeOf(ctx context.Context) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return ctx.Err()
}

// withTag returns a copy of env with every TagEnv (and ScopeEnv) entry
// replaced by one TagEnv=tag (and ScopeEnv=scope, when set) at the end.
func withTag(env []string, tag, scope string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, TagEnv+"=") && !strings.HasPrefix(kv, ScopeEnv+"=") {
			out = append(out, kv)
		}
	}
	out = append(out, TagEnv+"="+tag)
	if scope != "" {
		out = append(out, ScopeEnv+"="+scope)
	}
	return out
}

// ladder is the kill ladder of one Run. step is written only by run's
// goroutine and read after it has returned.
type ladder struct{ step string }

// run waits for ctx to be done, then takes the group through each of steps
// (the platform's ladderSteps), grace apart, until exited is closed.
func (l *ladder) run(ctx context.Context, g group, steps []string, grace time.Duration, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	case <-ctx.Done():
	}
	select {
	case <-exited: // both were ready: the child ended on its own
		return
	default:
	}
	for i, name := range steps {
		l.step = name
		g.step(i)
		if i == len(steps)-1 {
			return
		}
		t := time.NewTimer(grace)
		select {
		case <-exited:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// group is the platform's handle on the process group an engine runs in
// (process_unix.go: a POSIX process group; process_windows.go: a Job
// Object). holdGroup makes it for a started child.
type group interface {
	// step sends step i of the kill ladder (ladderSteps[i]) to the group.
	step(i int)
	// kill ends every process left in the group.
	kill()
	// close releases the handle (the group's processes are gone by then).
	close()
}
