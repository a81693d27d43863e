//go:build unix

package process

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// startSupervisor starts the supervisor of group pgid (see supervise.go).
// The returned func tells it the engine was handled and reaps it.
func startSupervisor(path string, sv supervision) (func(), error) {
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
	return func() {
		_, _ = w.Write([]byte{doneByte})
		_ = w.Close()
		_ = cmd.Wait()
	}, nil
}

// supervise waits until in says "done" (exit 0) or closes without it: then
// the aq that started the engine is gone, and the engine's group goes
// through the kill ladder and the job's tagged processes are swept.
func supervise(sv supervision, in io.Reader) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var b [1]byte
	if n, _ := in.Read(b[:]); n == 1 && b[0] == doneByte {
		return 0
	}
	grace := sv.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*grace+killWait)
	defer cancel()
	_, _ = StopScoped(ctx, sv.Tag, sv.Scope, grace)
	return 0
}

// groupAlive reports whether process group pgid has a member left.
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }
