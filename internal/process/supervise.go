package process

import (
	"encoding/json"
	"os"
	"strconv"
	"time"
)

// An engine must never run on without the aq that started it: aq enforces
// its budgets, so an engine that outlives aq spends without limit. When
// Spec.Supervisor names an executable, Run starts it beside the engine as a
// supervisor — a second process that holds the read end of a pipe whose
// write end only aq holds. When Run is done it writes "done" and the
// supervisor exits. When aq dies instead (kill -9, OOM, a panic), the kernel
// closes the pipe and the supervisor takes the engine's group through the
// kill ladder and sweeps the job's tagged processes, then exits. Pdeathsig
// cannot do this in Go: it fires when the *thread* that started the child
// exits (golang/go#27505).
//
// The supervisor is aq itself, re-executed with SuperviseEnv set: cmd/aq
// calls MaybeSupervise before anything else. It is started with a minimal
// environment without the job's tag (it must not sweep itself), in a process
// group of its own (a Ctrl-C at aq's terminal does not reach it), and it
// ignores SIGINT, SIGTERM and SIGHUP: only the pipe ends it. On Windows the
// engine's Job Object already ends with aq, and no supervisor is started.

// SuperviseEnv carries a supervisor's orders (JSON) to the re-executed aq.
const SuperviseEnv = "AQ_PROCESS_SUPERVISE"

// supervision is what a supervisor watches and how it stops it. The
// supervisor starts before the engine (so no instant exists in which the
// engine runs unwatched); the engine's process group id reaches it over the
// pipe once the engine has started ("p<pgid>\n"). The tag alone already
// finds the engine: it carries it from its first instruction.
type supervision struct {
	Pgid  int    `json:"pgid,omitempty"`
	Tag   string `json:"tag"`
	Scope string `json:"scope,omitempty"`
	// Run is the RunEnv value of the run watched: the sweep after aq died
	// takes only its processes (a later run of the job is not this one's).
	Run   string        `json:"run,omitempty"`
	Grace time.Duration `json:"grace"`
}

// MaybeSupervise runs this process as a supervisor when SuperviseEnv is set,
// and returns its exit code and true; otherwise it returns false at once.
func MaybeSupervise() (int, bool) {
	raw, ok := os.LookupEnv(SuperviseEnv)
	if !ok {
		return 0, false
	}
	var sv supervision
	if err := json.Unmarshal([]byte(raw), &sv); err != nil || sv.Pgid < 0 || sv.Tag == "" {
		_, _ = os.Stderr.WriteString("aq: " + SuperviseEnv + " is not a valid supervision order: " + strconv.Quote(raw) + "\n")
		return 2, true
	}
	return supervise(sv, os.Stdin), true
}

// doneByte is what Run writes when it has handled the engine itself;
// pgidByte starts the line that names the engine's process group.
const doneByte, pgidByte = 'd', 'p'
