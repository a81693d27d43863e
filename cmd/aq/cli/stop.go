package cli

// Signals always win (#32): SIGINT and SIGTERM cancel the command's
// context, and every step is meant to return on it — but a step blocked
// where no context reaches (a read of a FIFO, a hung file system, a child
// in uninterruptible sleep) would keep aq from exiting for good. So Main
// runs the command beside a watch: once the stop has begun (the first
// signal; for aq daemon, whose first SIGTERM drains, the second), the
// command has a bounded time to return, and after that it is abandoned:
// aq says so and exits 1. A job it was running is left in building/, and
// the next aq run recovers it (its engine's processes stopped by their
// tag, its worktree checkpointed) and fails it interrupted, saying what was
// abandoned (internal/abandon marks it; a job whose mark could not be
// written is recovered as a crash's).

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/aqfleet/aq/internal/abandon"
	"github.com/aqfleet/aq/internal/aqerr"
)

// defaultStopBound is how long a command has to return once its stop
// began: the kill ladder (two AQ_KILL_GRACE steps), the checkpoint and the
// report fit in it many times over.
const defaultStopBound = 2 * time.Minute

// markBound is how long an abandoning aq waits for its jobs' marks to be
// written: the file system that blocked the step may block them too.
const markBound = 2 * time.Second

// stopBound is AQ_STOP_BOUND, read from the environment directly (not the
// configuration: the step that blocks may be the one reading it).
func stopBound(getenv func(string) string) (time.Duration, error) {
	v := strings.TrimSpace(getenv("AQ_STOP_BOUND"))
	if v == "" {
		return defaultStopBound, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, aqerr.Usagef("set AQ_STOP_BOUND to a positive duration, e.g. 2m, or unset it", "AQ_STOP_BOUND=%q is not a positive duration", v)
	}
	return d, nil
}

// commandName is "aq <command>" for the command line args: its first word
// that looks like a command (lower-case letters and dashes), so that no
// flag's value — a path, a token — is ever quoted.
func commandName(args []string) string {
	for _, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyz-") == "" && !strings.HasPrefix(a, "-") {
			return "aq " + a
		}
	}
	return "aq"
}

// stopStage is the signal at which the bound starts for the command line
// args: the second for aq daemon (its first drains), else the first.
func stopStage(args []string) int {
	if commandName(args) == "aq daemon" {
		return 2
	}
	return 1
}

// awaitStop waits for the command's exit code on done. The first signal on
// sigs calls cancel; once signal number stage came, the command has bound
// to return, else it is abandoned: a line on w, and exit 1.
func awaitStop(done <-chan int, sigs <-chan os.Signal, cancel func(), stage int, bound time.Duration, command string, w io.Writer) int {
	var expired <-chan time.Time
	n := 0
	var last os.Signal
	for {
		select {
		case code := <-done:
			return code
		case s := <-sigs:
			n++
			last = s
			if n == 1 {
				cancel()
			}
			if n == stage {
				t := time.NewTimer(bound)
				defer t.Stop()
				expired = t.C
			}
		case <-expired:
			// The jobs it runs are marked for the aq that recovers them:
			// interrupted, not crash (internal/abandon).
			ids := abandon.Mark(fmt.Sprintf("%s was stopped by %s and abandoned the step it was in after AQ_STOP_BOUND (%s)", command, sigName(last), bound), markBound)
			jobs := "a job it was running is recovered by the next aq run"
			if len(ids) > 0 {
				slices.Sort(ids)
				jobs = "the next aq run recovers " + strings.Join(ids, ", ") + " and fails it interrupted"
			}
			fmt.Fprintf(w, "aq: %s did not stop within %s of %s (AQ_STOP_BOUND): the step it was in did not return — a FIFO, a hung file system or a wedged child — and was abandoned; %s\n",
				command, bound, sigName(last), jobs)
			return int(aqerr.Failed)
		}
	}
}

func sigName(s os.Signal) string {
	switch s {
	case nil:
		return "the signal"
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}
