//go:build unix

package process

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// supervisor is aq's end of a supervisor's pipe.
type supervisor struct {
	w   *os.File
	cmd *exec.Cmd
}

// startSupervisor starts the supervisor of the job sv names (see
// supervise.go), before the engine itself starts.
func startSupervisor(path string, sv supervision) (*supervisor, error) {
	orders, err := json.Marshal(sv)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path)
	cmd.Env = []string{SuperviseEnv + "=" + string(orders), "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = r
	SetGroup(cmd)
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start the engine's supervisor %s: %w", path, err)
	}
	r.Close() // only the supervisor holds the read end now
	return &supervisor{w: w, cmd: cmd}, nil
}

// watch tells the supervisor the engine's process group.
func (s *supervisor) watch(pgid int) {
	_, _ = fmt.Fprintf(s.w, "%c%d\n", pgidByte, pgid)
}

// done tells the supervisor the engine was handled, and reaps it.
func (s *supervisor) done() {
	_, _ = s.w.Write([]byte{doneByte})
	_ = s.w.Close()
	_ = s.cmd.Wait()
}

// supervise reads its orders from in until "done" (exit 0) or the end of
// the pipe without it: then the aq that started the engine is gone, and the
// engine's group (once named) goes through the kill ladder and the job's
// tagged processes are swept the same way.
func supervise(sv supervision, in io.Reader) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	r := bufio.NewReader(in)
	for {
		b, err := r.ReadByte()
		if err != nil {
			break // aq is gone
		}
		switch b {
		case doneByte:
			return 0
		case pgidByte:
			line, _ := r.ReadString('\n')
			if n, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && n > 1 {
				sv.Pgid = n
			}
		}
	}
	grace := sv.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	if sv.Pgid > 1 {
		g := pgroup(sv.Pgid)
		for i := range ladderSteps {
			if !groupAlive(sv.Pgid) {
				break
			}
			g.step(i)
			for deadline := time.Now().Add(grace); time.Now().Before(deadline) && groupAlive(sv.Pgid); {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*grace+killWait)
	defer cancel()
	w := wants(sv.Tag, sv.Scope)
	if sv.Run != "" {
		w = append(w, []byte(RunEnv+"="+sv.Run))
	}
	_, _ = stopLadder(ctx, w, grace)
	return 0
}

// groupAlive reports whether process group pgid has a member left.
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }
