//go:build !unit

package localrun

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/cli"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestRunOnceParks: `aq run --once` on a claude job whose claude (a fake
// printing the recorded rejected rate_limit_event stream, resets in two
// hours) hits its limit: one line saying the job is parked and until when,
// exit 3 (not a failure, nothing ran to the end); `aq status` says
// "parked: claude usage limit until HH:MM" and lists claude as held; the
// next claude job waits on the hold; `aq caps --json` lists the hold; a
// requeue by hand clears the job's own wait but not the engine's hold.
func TestRunOnceParks(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	reset := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	bin := parkedClaude(t, reset)
	h.Env = append(h.Env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "ANTHROPIC_API_KEY=sk-ant-test-0123456789")
	h.Submit(t, "limited", "repo: app\nengine: claude\nship: branch\n")

	r := h.Run(t, "run", "--once")
	until := reset.Local().Format("15:04")
	if reset.Local().YearDay() != time.Now().YearDay() {
		until = reset.Local().Format("Mon Jan 2 15:04")
	}
	if r.Code != 3 || !strings.Contains(r.Stderr, "job "+testenv.ID("limited")+" parked: claude usage limit until "+until) ||
		!strings.Contains(r.Stderr, "not a failure") || strings.Contains(r.Stderr, "failed") {
		t.Fatalf("aq run --once on a limited claude: %s", r)
	}

	h.Submit(t, "after", "repo: app\nengine: claude\nship: branch\n")
	b := board(t, h)
	why := map[string]cli.WaitingJob{}
	for _, w := range b.Waiting {
		why[w.ID] = w
	}
	if w := why[testenv.ID("limited")]; !strings.HasPrefix(w.Why, "parked: claude usage limit until "+until) || !w.Until.Equal(reset) {
		t.Errorf("the parked job: %+v", w)
	}
	if w := why[testenv.ID("after")]; !strings.HasPrefix(w.Why, "held: claude usage limit until "+until) || !strings.Contains(w.Why, testenv.ID("limited")) {
		t.Errorf("a claude job while claude is held: %+v", w)
	}
	if len(b.Holds) != 1 || b.Holds[0].Engine != "claude" || !b.Holds[0].Until.Equal(reset) || len(b.Failed) != 0 {
		t.Errorf("holds %+v, failed %+v", b.Holds, b.Failed)
	}
	if text := h.Run(t, "status").Stdout; !strings.Contains(text, "held engines") || !strings.Contains(text, "parked: claude usage limit until "+until) {
		t.Errorf("aq status:\n%s", text)
	}
	var c struct {
		Holds []struct {
			Engine string    `json:"engine"`
			Until  time.Time `json:"until"`
		} `json:"holds"`
	}
	if r := h.Run(t, "caps", "--json"); r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &c) != nil || len(c.Holds) != 1 || !c.Holds[0].Until.Equal(reset) {
		t.Errorf("aq caps --json holds: %+v (%s)", c.Holds, r)
	}

	// Nothing runnable now: claude is held (its jobs would only park).
	if r := h.Run(t, "run", "--once"); r.Code != 3 || !strings.Contains(r.Stderr, "no runnable job") {
		t.Errorf("aq run --once with claude held: %s", r)
	}
	// A requeue by hand lifts the job's own wait; the engine's hold remains.
	if r := h.Run(t, "job", "requeue", testenv.ID("limited")); r.Code != 0 {
		t.Fatalf("requeue: %s", r)
	}
	v := show(t, h, "limited")
	if v.Stage != job.Inbox || v.Attempts != 0 {
		t.Errorf("after requeue: %+v", v)
	}
	b = board(t, h)
	for _, w := range b.Waiting {
		if w.ID == testenv.ID("limited") && !strings.HasPrefix(w.Why, "held: claude") {
			t.Errorf("the requeued job while claude is held: %+v", w)
		}
	}
}

// parkedClaude writes a claude that answers --version and --help as the
// real 2.1.197 does (testenv.FakeClaude) and whose runs end in the recorded
// rejected rate_limit_event stream, resetsAt set to reset; it returns its
// directory.
func parkedClaude(t *testing.T, reset time.Time) string {
	t.Helper()
	dir := t.TempDir()
	testenv.FakeClaude{Script: "echo wip > wip.txt", Stream: testenv.RateLimitedStream(t, dir, reset), Exit: 1}.Write(t, dir)
	return dir
}
