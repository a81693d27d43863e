//go:build linux

package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/process"
)

// Input is everything the checks read, gathered after the run: a pure
// value, so that Check is a function of it (and tested on made-up ones).
type Input struct {
	Jobs      []JobSpec
	Factories []FactoryData
	// State is the stub's state file at the end; Calls its call log.
	State *coord.Snapshot
	Calls []coord.Call
	// Requests are every request the factories made of the stub, with the
	// answer (injected 503s included).
	Requests []Request
	// Pushes are the ref updates the origins took (their post-receive hook).
	Pushes []Push
	// OriginJobTips: every refs/heads/aq/job/<id> on an origin after gc:
	// job id → its tip and message.
	OriginJobTips map[string]Commit
	Faults        []FaultRecord
	LeaseTTL      time.Duration
	// CheckpointInterval is the factories' AQ_CHECKPOINT_INTERVAL.
	CheckpointInterval time.Duration
	// Runs are the scripted engine's runs, from its own step log.
	Runs      []EngineRun
	Converged bool
	Problems  []string
	// Alive are the processes still alive at the end that carry a job's
	// tag or a factory's scope ("pid job|scope").
	Alive []string
	GC    []GCResult
}

// Commit is a commit and its message.
type Commit struct {
	SHA     string `json:"sha"`
	Message string `json:"message"`
}

// FactoryData is what one factory left on its disk.
type FactoryData struct {
	ID        string
	Index     int
	Spool     []string // reports still waiting
	SpoolDead []string // reports refused for good
	Records   map[string]jobstate.Record
	Delivered []Delivered // "report delivered" lines of its logs
	// Redelivered: job → the result commit its logs say it found on origin
	// and reported without running the engine (its logs outlive a lost
	// host's AQ_HOME, where the job record was).
	Redelivered map[string]string
	Orphans     int // orphans recovered at start-ups
	Errors      int // ERROR lines in its logs
	Exits       []string
}

// Delivered is one report a factory logged as delivered.
type Delivered struct {
	Job    string
	Epoch  int64
	Report string // the PATCH stage, or fail:<reason>
}

// Push is one ref update an origin took.
type Push struct {
	T       time.Time
	Factory string
	Phase   string // run | gc
	Repo    string
	Old     string
	New     string
	Ref     string
}

// Deletes reports whether the update deleted the ref.
func (p Push) Deletes() bool { return strings.Trim(p.New, "0") == "" }

func (r *harness) collect(jobs []JobSpec, gcs []GCResult) (*Input, error) {
	in := &Input{Jobs: jobs, LeaseTTL: r.cfg.LeaseTTL, Converged: r.res.Converged, Faults: r.res.Faults, GC: gcs,
		CheckpointInterval: r.cfg.CheckpointInterval, Runs: readRuns(r.sb.runsDir())}
	in.Problems = append(in.Problems, r.res.Problems...)
	st, err := coord.ReadStateFile(r.sb.path("coord", "state.json"))
	if err != nil {
		return nil, err
	}
	in.State = st
	if in.Calls, err = readJSONL(r.sb.path("coord", "calls.jsonl"), func(c coord.Call) time.Time { return c.At }); err != nil {
		return nil, err
	}
	if in.Requests, err = readJSONL(r.sb.path("coord", "requests.jsonl"), func(q Request) time.Time { return q.At }); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if in.Pushes, err = readPushes(r.sb.pushLog()); err != nil {
		return nil, err
	}
	in.OriginJobTips = map[string]Commit{}
	for _, bare := range r.sb.origins {
		out, err := r.sb.git(bare, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/aq/job/")
		if err != nil {
			return nil, err
		}
		for _, line := range nonEmptyLines(out) {
			ref, sha, _ := strings.Cut(line, " ")
			msg, _ := r.sb.git(bare, "log", "-1", "--format=%B", sha)
			in.OriginJobTips[strings.TrimPrefix(ref, "refs/heads/aq/job/")] = Commit{SHA: sha, Message: msg}
		}
	}
	var scopes []string
	for _, f := range r.facts {
		fd := FactoryData{ID: f.id, Index: f.i, Records: map[string]jobstate.Record{}, Exits: f.exits}
		fd.Spool = spoolFiles(f.home)
		fd.SpoolDead = listJSON(filepath.Join(f.home, "spool", "dead"))
		if store, err := jobstate.Open(filepath.Join(f.home, "state", "jobs")); err == nil {
			recs, _ := store.List()
			for _, rec := range recs {
				fd.Records[rec.ID] = rec
			}
		}
		fd.Delivered, fd.Redelivered, fd.Orphans, fd.Errors = readFactoryLog(f.log)
		in.Factories = append(in.Factories, fd)
		scopes = append(scopes, runner.Scope(f.home))
	}
	for _, j := range jobs {
		pids, _ := process.FindScoped(j.ID, "")
		for _, p := range pids {
			in.Alive = append(in.Alive, strconv.Itoa(p)+" "+j.ID)
		}
	}
	for _, s := range scopes {
		for _, p := range findScope(s) {
			in.Alive = append(in.Alive, strconv.Itoa(p)+" scope "+s)
		}
	}
	for _, p := range findCmdline(r.sb.stragglerMark()) {
		in.Alive = append(in.Alive, strconv.Itoa(p)+" straggler")
	}
	return in, nil
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// readJSONL reads a JSON-lines log, sorted by at. A line that does not
// parse (an empty one, or one torn by a SIGKILL mid-write: not expected) is
// skipped.
func readJSONL[T any](path string, at func(T) time.Time) ([]T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []T
	for _, line := range bytes.Split(b, []byte("\n")) {
		var v T
		if json.Unmarshal(line, &v) == nil {
			out = append(out, v)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return at(out[a]).Before(at(out[b])) })
	return out, nil
}

func readPushes(path string) ([]Push, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Push
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var raw struct {
			T       json.Number `json:"t"`
			Factory string      `json:"factory"`
			Phase   string      `json:"phase"`
			Repo    string      `json:"repo"`
			Old     string      `json:"old"`
			New     string      `json:"new"`
			Ref     string      `json:"ref"`
		}
		if err := json.Unmarshal(line, &raw); err != nil {
			continue
		}
		f, _ := raw.T.Float64()
		sec := int64(f)
		out = append(out, Push{T: time.Unix(sec, int64((f-float64(sec))*1e9)).UTC(), Factory: raw.Factory, Phase: raw.Phase,
			Repo: raw.Repo, Old: raw.Old, New: raw.New, Ref: raw.Ref})
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].T.Before(out[b].T) })
	return out, nil
}

// spoolFiles are the reports waiting in home's spool.
func spoolFiles(home string) []string { return listJSON(filepath.Join(home, "spool")) }

func listJSON(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".json") && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// readFactoryLog reads a factory's JSON log lines (every incarnation).
func readFactoryLog(path string) (delivered []Delivered, redelivered map[string]string, orphans, errs int) {
	redelivered = map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return nil, redelivered, 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l struct {
			Msg    string `json:"msg"`
			Level  string `json:"level"`
			Job    string `json:"job"`
			Epoch  int64  `json:"epoch"`
			Report string `json:"report"`
			Commit string `json:"commit"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Msg {
		case "report delivered":
			// A job's logs uploaded as artifacts go through the same
			// spool and reporter, but are no lease call of the stub's
			// (nor in its state file): not a report this invariant counts.
			if strings.HasPrefix(l.Report, "artifact:") {
				continue
			}
			delivered = append(delivered, Delivered{Job: l.Job, Epoch: l.Epoch, Report: l.Report})
		case "recovering an orphaned job: the aq that ran it is gone":
			orphans++
		case redeliveredMsg:
			redelivered[l.Job] = l.Commit
		}
		if l.Level == "ERROR" {
			errs++
		}
	}
	return delivered, redelivered, orphans, errs
}

// redeliveredMsg is the runner's log line for a result found on origin and
// reported without running the engine (agent/runner redeliver).
const redeliveredMsg = "the job's result is already on origin (an earlier attempt pushed it): reporting it, not running the engine again"

// findCmdline lists the live processes (not zombies) whose command line
// holds mark: a straggler, which dropped the job's tag and scope.
func findCmdline(mark string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(mark)) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !bytes.Contains(st, []byte(") Z ")) {
			out = append(out, pid)
		}
	}
	return out
}

// findScope lists the live processes (not zombies) whose environment holds
// AQ_SCOPE=scope: a factory's engines, wherever they escaped to.
func findScope(scope string) []int {
	want := process.ScopeEnv + "=" + scope
	return findEnv(func(kv string) bool { return kv == want })
}

// findEnv lists the live processes (not zombies) with an environment entry
// that match accepts.
func findEnv(match func(kv string) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !slices.ContainsFunc(strings.Split(string(env), "\x00"), match) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
		}
		out = append(out, pid)
	}
	return out
}
