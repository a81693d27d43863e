//go:build unix

package runfail

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// These tests run the real aq binary (built once, with -race when the tests
// have it) against a temp AQ_HOME, real git repositories and script engines
// that leave markers in $MARK. Waits are on marker files; the timeouts are
// deadlock guards that fail the test, never speed requirements.

func noTagged(t *testing.T, name string) {
	t.Helper()
	id := testenv.ID(name)
	if pids, err := process.FindTagged(id); err != nil || len(pids) > 0 {
		t.Errorf("processes tagged AQ_JOB_ID=%s alive: %v %v", id, pids, err)
	}
}

// k9Script is an engine that, on its first run, writes files and then keeps
// writing (atomically, logging each write to $MARK/written) until it is
// killed; a later run that finds its progress copies it to $MARK/seen and
// its prompt to $MARK/prompt.
const k9Script = `if [ -f progress ]; then cp progress "$MARK/seen"; cat > "$MARK/prompt"; echo final > final.txt; exit 0; fi
echo first > first.txt
rm README.md
i=0
while :; do
  i=$((i+1))
  echo $i > p.tmp && mv p.tmp progress && echo $i >> "$MARK/written"
  [ $i -eq 3 ] && touch "$MARK/ready"
  sleep 0.01
done`

// TestRunKill9MidJob: aq is killed with SIGKILL while its engine writes.
// The engine's supervisor stops it with aq; the next `aq status` (or `aq
// run`) checkpoints its worktree and requeues the job with one more attempt, and
// the re-run starts from that checkpoint: no file the engine wrote is lost.
func TestRunKill9MidJob(t *testing.T) {
	for _, next := range []string{"status", "run"} {
		t.Run("recovered_by_"+next, func(t *testing.T) {
			t.Parallel()
			h, mark := clitest.MarkedHome(t)
			repo := h.Repo(t, "app", nil)
			k9 := testenv.ID("k9-" + next)
			h.Submit(t, k9, clitest.ScriptJob("app", k9Script, "ship: branch"))
			aq := clitest.Start(t, h, "run", "--once")
			aq.WaitMark(mark, "ready")
			if err := syscall.Kill(aq.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if r := aq.Wait(); r.Code != -1 {
				t.Fatalf("aq was not killed: %s", r)
			}
			// aq is dead, and its engine's supervisor stops the engine (and
			// what it started) through the kill ladder: no engine runs on
			// without its aq. The limit: two ladder graces plus the sweep,
			// well inside this deadline guard.
			deadline := time.Now().Add(15 * time.Second)
			for pids, _ := process.FindTagged(k9); len(pids) > 0; pids, _ = process.FindTagged(k9) {
				if time.Now().After(deadline) {
					t.Fatalf("the engine outlived its aq: %v still carry the job's tag", pids)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if v := show(t, h, k9); v.Stage != job.Building {
				t.Fatalf("after kill -9 the job is in %s, want building", v.Stage)
			}

			if next == "status" {
				b := board(t, h)
				if len(b.Recovered) != 1 || b.Recovered[0] != k9 {
					t.Fatalf("status recovered %v, want [%s]", b.Recovered, k9)
				}
				noTagged(t, k9)
				v := show(t, h, k9)
				if v.Stage != job.Inbox || v.Attempts != 1 || v.Reason != job.ReasonCrash || v.Checkpoint == "" {
					t.Fatalf("after recovery: stage %s attempts %d reason %q checkpoint %q", v.Stage, v.Attempts, v.Reason, v.Checkpoint)
				}
				wip := testenv.TreeFiles(t, repo, "aq/wip/"+k9)
				if testenv.Git(t, repo, "rev-parse", "aq/wip/"+k9) != v.Checkpoint {
					t.Error("the sidecar's checkpoint is not aq/wip/k9")
				}
				if wip["first.txt"] != "first" {
					t.Errorf("first.txt lost: %v", sortedKeys(wip))
				}
				if _, ok := wip["README.md"]; ok {
					t.Error("the engine's deletion of README.md was lost")
				}
				written := strings.Fields(testenv.ReadFile(t, filepath.Join(mark, "written")))
				last, _ := strconv.Atoi(written[len(written)-1])
				if cp, _ := strconv.Atoi(wip["progress"]); cp < last || cp > last+1 {
					t.Errorf("the engine wrote progress=%d, the checkpoint has %q: a write was lost", last, wip["progress"])
				}
				if b := board(t, h); len(b.Recovered) != 0 {
					t.Errorf("a second status recovered %v again", b.Recovered)
				}
			}

			r := h.Run(t, "run", "--once")
			if r.Code != 0 {
				t.Fatalf("re-run: %s", r)
			}
			noTagged(t, k9)
			v := show(t, h, k9)
			if v.Stage != job.Shipped || v.Attempts != 2 {
				t.Fatalf("after the re-run: stage %s attempts %d (%s)", v.Stage, v.Attempts, v.Detail)
			}
			seen := strings.TrimSpace(testenv.ReadFile(t, filepath.Join(mark, "seen")))
			written := strings.Fields(testenv.ReadFile(t, filepath.Join(mark, "written")))
			last, _ := strconv.Atoi(written[len(written)-1])
			if n, err := strconv.Atoi(seen); err != nil || n < last || n > last+1 {
				t.Errorf("the re-run started from progress=%q; the engine had written %d", seen, last)
			}
			files := testenv.TreeFiles(t, repo, "aq/job/"+k9)
			if files["first.txt"] != "first" || files["final.txt"] != "final" || files["progress"] != seen {
				t.Errorf("result: %v", files)
			}
			if _, ok := files["README.md"]; ok {
				t.Error("the first run's deletion was lost")
			}
			// The re-run was told why the killed attempt ended and that it
			// resumes from that attempt's checkpoint.
			prompt := testenv.ReadFile(t, filepath.Join(mark, "prompt"))
			for _, want := range []string{"This job ran before. Its attempt 1 ended: crash (recovered: the process running it", "is gone; checkpoint ",
				"cut off by the machine running it", "resumes from a checkpoint of the earlier work"} {
				if !strings.Contains(prompt, want) {
					t.Errorf("the retry's prompt lacks %q:\n%s", want, prompt)
				}
			}
		})
	}
}

// TestRunSignalToAQ: SIGINT or SIGTERM to aq mid-job stops the engine through
// the ladder, checkpoints, and requeues the job (interrupted, runnable at
// once); aq exits 1. The next run resumes from the checkpoint.
func TestRunSignalToAQ(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			h, mark := clitest.MarkedHome(t)
			repo := h.Repo(t, "app", map[string]string{"keep.txt": "keep\n", "doomed.txt": "doomed\n", ".gitignore": "*.log\n"})
			sigID := testenv.ID("sig-" + sig.String())
			h.Submit(t, sigID, clitest.ScriptJob("app", `if [ -f new.txt ]; then echo resumed > "$MARK/resumed"; exit 0; fi
echo changed >> keep.txt
rm doomed.txt
echo new > new.txt
echo noise > x.log
sleep 300 &
echo $! > "$MARK/sleep.pid"
touch "$MARK/ready"
wait`, "ship: none"))
			aq := clitest.Start(t, h, "run", "--once")
			aq.WaitMark(mark, "ready")
			if err := syscall.Kill(aq.PID, sig); err != nil {
				t.Fatal(err)
			}
			r := aq.Wait()
			if r.Code != 1 {
				t.Fatalf("aq after %v: %s", sig, r)
			}
			noTagged(t, sigID)
			pid, _ := strconv.Atoi(strings.TrimSpace(testenv.ReadFile(t, filepath.Join(mark, "sleep.pid"))))
			if process.Alive(pid) {
				t.Errorf("the engine's child %d survived", pid)
			}
			v := show(t, h, sigID)
			if v.Stage != job.Inbox || v.Reason != job.ReasonInterrupted || v.Checkpoint == "" {
				t.Fatalf("after %v: stage %s reason %q checkpoint %q", sig, v.Stage, v.Reason, v.Checkpoint)
			}
			wip := testenv.TreeFiles(t, repo, v.Checkpoint)
			if wip["keep.txt"] != "keep\nchanged" || wip["new.txt"] != "new" {
				t.Errorf("checkpoint: %v", wip)
			}
			if _, ok := wip["doomed.txt"]; ok {
				t.Error("deletion not checkpointed")
			}
			if _, ok := wip["x.log"]; ok {
				t.Error("ignored file checkpointed")
			}
			if r := h.Run(t, "run", "--once"); r.Code != 0 || !testenv.Exists(filepath.Join(mark, "resumed")) {
				t.Fatalf("re-run: %s", r)
			}
		})
	}
}

// TestRunFailureReasons: every failure reason of local mode is reachable from
// a manifest and recorded in the job's sidecar; aq run --once exits 1.
func TestRunFailureReasons(t *testing.T) {
	wait := "sleep 30"
	cases := []struct {
		name       string
		front      string
		want       job.Reason
		detail     string
		noWorktree bool
	}{
		{"timeout", clitest.ScriptJob("app", wait, "budget: {wall: 1s}"), job.ReasonTimeout, "wall", false},
		{"budget_tokens", clitest.ScriptJob("app", "echo ::aq-usage tokens_in=600 tokens_out=600\n"+wait, "budget: {tokens: 1000}"), job.ReasonBudgetExceeded, "tokens", false},
		{"budget_usd", clitest.ScriptJob("app", "echo ::aq-usage cost_usd=1.25 turns=1\n"+wait, "budget: {usd: 1}"), job.ReasonBudgetExceeded, "$1.25", false},
		// AQ_VERIFY_ROUNDS's default: two repair rounds before verify_failed.
		{"verify_failed", clitest.ScriptJob("app", "echo x > x.txt", "verify: test -f y.txt"), job.ReasonVerifyFailed, "after 2 repair rounds", false},
		{"verify_failed_no_rounds", clitest.ScriptJob("app", "echo x > x.txt", "verify: test -f y.txt", "verify_rounds: 0"), job.ReasonVerifyFailed, "test -f y.txt", false},
		{"no_engine_path", clitest.ScriptJob("app", "no-such-tool-xyz --fix"), job.ReasonNoEngine, "no-such-tool-xyz", true},
		{"no_engine_127", clitest.ScriptJob("app", "./tools/missing.sh"), job.ReasonNoEngine, "127", false},
		{"engine_failed", clitest.ScriptJob("app", "exit 2"), job.ReasonEngineFailed, "exited 2", false},
		{"engine_unavailable", clitest.ScriptJob("app", "echo '::aq-unavailable usage limit reached'"), job.ReasonEngineUnavailable, "usage limit", false},
		{"repo_unavailable_missing", clitest.ScriptJob("ghost", "true"), job.ReasonRepoUnavailable, "ghost", true},
		{"repo_unavailable_base", clitest.ScriptJob("app", "true", "base: release-9"), job.ReasonRepoUnavailable, "release-9", true},
		{"capability_mismatch", clitest.ScriptJob("app", "true", "ship: pr"), job.ReasonCapabilityMismatch, "has:gh", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := clitest.BinHome(t)
			h.Repo(t, "app", nil)
			id := testenv.ID(strings.ReplaceAll(c.name, "_", "-"))
			h.Submit(t, id, c.front)
			r := h.Run(t, "run", "--once")
			if r.Code != 1 || !strings.Contains(r.Stderr, string(c.want)) {
				t.Fatalf("aq run --once: want exit 1 naming %s: %s", c.want, r)
			}
			v := show(t, h, id)
			if v.Reason != c.want || !strings.Contains(v.Detail, c.detail) {
				t.Errorf("sidecar reason %q detail %q, want %q with %q", v.Reason, v.Detail, c.want, c.detail)
			}
			wantStage := job.DeadLetter
			if job.Retryable(c.want, 1, job.Retry{}) {
				wantStage = job.Inbox
			}
			if v.Stage != wantStage || v.Attempts != 1 {
				t.Errorf("stage %s attempts %d, want %s after one attempt", v.Stage, v.Attempts, wantStage)
			}
			if last := v.History[len(v.History)-1]; last.From != job.Building || last.Reason != c.want {
				t.Errorf("last transition %+v", last)
			}
			repo := "app"
			if c.name == "repo_unavailable_missing" {
				repo = "ghost"
			}
			// A worktree that was made is where the job ran or, checkpointed,
			// back in the repository's pool.
			made := testenv.Exists(h.Worktree(repo, id)) || (v.Checkpoint != "" && testenv.Exists(filepath.Join(h.Dir, "worktrees", ".pool", repo, "0")))
			if made == c.noWorktree {
				t.Errorf("worktree made: %v, want %v", made, !c.noWorktree)
			}
			noTagged(t, id)
		})
	}
}

// TestRunInvalidManifestInQueue: a queued manifest edited to be invalid fails
// with invalid_manifest when taken; a corrupt sidecar sends its job to failed
// and is kept as .corrupt.
func TestRunInvalidManifestInQueue(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	edited, garbled := testenv.ID("edited"), testenv.ID("garbled")
	h.Submit(t, edited, clitest.ScriptJob("app", "true"))
	testenv.WriteFile(t, filepath.Join(h.Queue("inbox"), edited+".md"), "---\nid: "+edited+"\nrepo: app\nengine: script\n---\n# no script\n")
	if r := h.Run(t, "run", "--once"); r.Code != 1 || !strings.Contains(r.Stderr, "invalid_manifest") {
		t.Fatalf("edited manifest: %s", r)
	}
	if v := show(t, h, "edited"); v.Stage != job.Failed || v.Reason != job.ReasonInvalidManifest {
		t.Errorf("edited: %s %s", v.Stage, v.Reason)
	}

	h.Submit(t, garbled, clitest.ScriptJob("app", "true"))
	testenv.WriteFile(t, filepath.Join(h.Queue("inbox"), garbled+".json"), "\x00\x01 not json")
	if r := h.Run(t, "run", "--once"); r.Code != 3 {
		t.Fatalf("corrupt sidecar: %s", r)
	}
	if v := show(t, h, "garbled"); v.Stage != job.Failed || v.Reason != job.ReasonInvalidManifest || !strings.Contains(v.Detail, ".corrupt") {
		t.Errorf("garbled: %s %s %s", v.Stage, v.Reason, v.Detail)
	}
	if got := testenv.ReadFile(t, filepath.Join(h.Queue("failed"), garbled+".json.corrupt")); got != "\x00\x01 not json" {
		t.Errorf("kept corrupt file: %q", got)
	}
	if !testenv.Exists(filepath.Join(h.Queue("failed"), garbled+".md")) {
		t.Error("the manifest of the corrupt job is gone")
	}
}

// TestRunHomeNotWritable: an AQ_HOME that cannot be created is a usage error
// (exit 2) in one line that names it.
func TestRunHomeNotWritable(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h := clitest.BinHome(t)
	file := filepath.Join(t.TempDir(), "plain-file")
	testenv.WriteFile(t, file, "not a directory")
	h.Env = append(h.Env, "AQ_HOME="+filepath.Join(file, "home"))
	manifest := testenv.Manifest(t, t.TempDir(), "x", clitest.ScriptJob("app", "true"))
	for _, args := range [][]string{{"run", "--once"}, {"status"}, {"submit", manifest}, {"job", "show", "x"}} {
		r := h.Run(t, args...)
		lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
		if r.Code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "aq: ") || !strings.Contains(lines[0], file) {
			t.Errorf("aq %v: want exit 2 and one line naming %s: %s", args, file, r)
		}
	}
}

// TestRunOnceSaysWhyNothingRuns: exit 3's line names the first job aq run
// would take and why it waits (here: its engine is not installed), how many
// more wait, and says so when nothing is queued at all.
func TestRunOnceSaysWhyNothingRuns(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	bin := t.TempDir()
	for _, tool := range []string{"git", "sh"} { // a PATH without claude, whatever this host has
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skip(tool + " is not installed")
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	h.Env = append(h.Env, "PATH="+bin)
	oneLine := func(r testenv.Result, want ...string) {
		t.Helper()
		lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
		if r.Code != 3 || len(lines) != 1 {
			t.Fatalf("want exit 3 and one line: %s", r)
		}
		for _, w := range want {
			if !strings.Contains(lines[0], w) {
				t.Errorf("the line lacks %q: %s", w, lines[0])
			}
		}
	}
	oneLine(h.Run(t, "run", "--once"), "aq: no runnable job: nothing is queued", "`aq submit FILE.md` queues a job")

	claude := testenv.ID("needs-claude")
	h.Submit(t, "needs-claude", "repo: app\nengine: claude\nship: branch")
	oneLine(h.Run(t, "run", "--once"),
		"aq: no runnable job: "+claude+" (inbox) waits: this host cannot run it: missing capability: engine:claude (not installed)",
		"(`aq status` shows what is queued and why it waits)")

	h.Submit(t, "after", clitest.ScriptJob("app", "true", "deps: ["+claude+"]"))
	oneLine(h.Run(t, "run", "--drain"), "no runnable job: "+claude+" (inbox) waits:", "(1 more job(s) wait; `aq status` shows")
}

// TestRunExitCodes: 3 with nothing to run, 0 on success, 1 on failure.
func TestRunExitCodes(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	if r := h.Run(t, "run", "--once"); r.Code != 3 || !strings.Contains(r.Stderr, "no runnable job") {
		t.Errorf("empty queue: %s", r)
	}
	h.Submit(t, "good", clitest.ScriptJob("app", "echo ok > ok.txt", "priority: high"))
	h.Submit(t, "bad", clitest.ScriptJob("app", "exit 1"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 || !strings.Contains(r.Stdout, "job "+testenv.ID("good")) {
		t.Errorf("success (priority high goes first): %s", r)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 1 || !strings.Contains(r.Stderr, "job "+testenv.ID("bad")+" failed (engine_failed)") {
		t.Errorf("failure: %s", r)
	}
	if r := h.Run(t, "run", "--drain"); r.Code != 3 {
		t.Errorf("drain of an empty queue: %s", r)
	}
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestRunQueueProblemDoesNotStopRun: an entry the queue cannot repair (here a
// directory where a sidecar should be) is reported, and the other jobs still
// run.
func TestRunQueueProblemDoesNotStopRun(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	h.Submit(t, "fine", clitest.ScriptJob("app", "echo ok > ok.txt"))
	if err := os.Mkdir(filepath.Join(h.Queue("inbox"), "weird.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(h.Queue("inbox"), "weird.md"), "---\nid: weird\n---\n")
	r := h.Run(t, "run", "--once")
	if r.Code != 0 || !strings.Contains(r.Stderr, "weird.json") || !strings.Contains(r.Stdout, testenv.ID("fine")) {
		t.Fatalf("want the good job run and the problem reported: %s", r)
	}
}
