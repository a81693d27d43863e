//go:build linux

package chaos

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// EngineRun is one run of the scripted engine, from what it wrote under
// runs/<job>/<n>/ on the shared file system (engineScript).
type EngineRun struct {
	Job     string
	N       int
	Factory string
	Start   time.Time
	Part1   time.Time // when it wrote part one (zero: it never did)
	Alive   time.Time // the last sign of life of the engine
	Done    time.Time // when it finished (zero: it never did)
	// Found1 is the run whose part one this run found in its worktree when
	// it started (0: none): the work it resumed from.
	Found1 int
	// Straggler is the last sign of life of the straggler the run
	// daemonised (zero: it had none); it was up before the run went on.
	Straggler time.Time
}

// readRuns reads every engine run under dir.
func readRuns(dir string) []EngineRun {
	var out []EngineRun
	jobs, _ := os.ReadDir(dir)
	for _, j := range jobs {
		ns, _ := os.ReadDir(filepath.Join(dir, j.Name()))
		for _, n := range ns {
			num, err := strconv.Atoi(n.Name())
			if err != nil {
				continue
			}
			d := filepath.Join(dir, j.Name(), n.Name())
			run := EngineRun{Job: j.Name(), N: num}
			if b, err := os.ReadFile(filepath.Join(d, "who")); err == nil {
				run.Factory, _, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
			}
			run.Start, run.Part1 = stamp(filepath.Join(d, "start")), stamp(filepath.Join(d, "part1"))
			run.Alive, run.Done = stamp(filepath.Join(d, "alive")), stamp(filepath.Join(d, "done"))
			run.Straggler = stamp(filepath.Join(d, "straggler"))
			if b, err := os.ReadFile(filepath.Join(d, "found1")); err == nil {
				// "part one, run K"
				f := strings.Fields(string(b))
				if len(f) > 0 {
					run.Found1, _ = strconv.Atoi(f[len(f)-1])
				}
			}
			out = append(out, run)
		}
	}
	return out
}

// stamp reads a `date +%s.%N` file; zero when absent or unreadable.
func stamp(path string) time.Time {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}
	}
	sec, frac, _ := strings.Cut(strings.TrimSpace(string(b)), ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	ns, _ := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	return time.Unix(s, ns).UTC()
}
