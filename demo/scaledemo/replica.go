package scaledemo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/internal/process"
)

// replica is one `aq run --once` process, as a scaler starts it: its own
// factory id, a fresh AQ_HOME and an empty repo base.
type replica struct {
	id, dir, home, base, logPath string

	cmd    *exec.Cmd
	done   chan struct{}
	code   int  // once done; -1 when killed by a signal
	killed bool // kill -9 by the demo
	took   bool // seen holding a job (its status file, or the stub)
}

func newReplica(ws string, n int) *replica {
	id := fmt.Sprintf("replica-%d", n)
	dir := filepath.Join(ws, "replicas", id)
	return &replica{id: id, dir: dir, home: filepath.Join(dir, "home"), base: filepath.Join(dir, "src"), logPath: filepath.Join(ws, "replicas", id+".log")}
}

func (r *replica) start(aqBin string, env []string, wait string) error {
	if err := os.MkdirAll(r.base, 0o755); err != nil {
		return err
	}
	logf, err := os.Create(r.logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(aqBin, "run", "--once", "--wait", wait)
	cmd.Env = append(append([]string{}, env...), "AQ_HOME="+r.home, "AQ_REPO_BASE="+r.base, "AQ_FACTORY_ID="+r.id)
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	process.SetGroup(cmd) // a Ctrl-C reaches the demo, which stops its children itself
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", r.id, err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		r.code = cmd.ProcessState.ExitCode()
		close(r.done)
	}()
	return nil
}

func (r *replica) running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// holding reports whether the replica's status file shows a job (it took
// its message): a replica that has not is pending, in KEDA's terms.
func (r *replica) holding() bool {
	if r.took {
		return true
	}
	st, err := daemon.ReadStatus(filepath.Join(r.home, "state"))
	if err == nil && len(st.Running) > 0 {
		r.took = true
	}
	return r.took
}
