package board

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"
)

// The model is driven with messages, as Bubble Tea drives it; the terminal
// itself is tested by the cli package's tmux tests.

type source struct {
	mu      sync.Mutex
	snaps   []*Snapshot // handed out in turn; the last one repeats
	acts    []string
	actErr  error
	follow  []string
	reads   int
	started chan string
}

func (s *source) Snapshot(context.Context) *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	snap := s.snaps[0]
	if len(s.snaps) > 1 {
		s.snaps = s.snaps[1:]
	}
	return snap
}

func (s *source) Act(_ context.Context, id, action string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acts = append(s.acts, action+" "+id)
	if s.actErr != nil {
		return "", s.actErr
	}
	return action + "d " + id, nil
}

func (s *source) Follow(ctx context.Context, id string, emit func(string)) error {
	if s.started != nil {
		s.started <- id
	}
	for _, l := range s.follow {
		emit(l)
	}
	return nil
}

var at = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func localSnap() *Snapshot {
	return &Snapshot{
		At: at, Mode: "local", Where: "/home/op/.aq",
		Stages: []Count{{"inbox", 1}, {"building", 1}, {"review", 1}, {"failed", 1}},
		Running: []Row{{ID: "job-run", Stage: "building", Repo: "app", Engine: "claude", Phase: "engine", Elapsed: 125 * time.Second,
			HasUsage: true, Tokens: 48800, Cost: 0.0396, Last: "→ Edit parse/range.go"}},
		Waiting: []Row{{ID: "job-wait", Stage: "blocked", Last: "waiting for its deps to ship: job-run"}},
		Review:  []Row{{ID: "job-rev", Stage: "review", Repo: "app", Last: "aq/job/job-rev"}},
		Failed:  []Row{{ID: "job-bad", Stage: "dead_letter", Attempts: 3, Last: "engine_failed: script exited 2"}},
		Daemon:  &Daemon{FactoryID: "f1", Alive: true, Stage: "running", Slots: 2, Busy: 1, Source: "broker", Broker: "healthy", HeartbeatAge: 4 * time.Second, Healthy: true},
		Sandbox: &Sandbox{Line: "full (namespaces+landlock): files, network, processes, stragglers hold; missing: limits (cgroup v1)"},
	}
}

func newModel(t *testing.T, src *source) *Model {
	t.Helper()
	m := New(context.Background(), Options{Source: src, Interval: time.Second, Now: func() time.Time { return at }})
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	run(t, m, m.Init())
	return m
}

// run executes cmd and feeds its message back, as the runtime would (tick
// commands are left out: they only schedule the next refresh).
func run(t *testing.T, m *Model, cmd tea.Cmd) {
	t.Helper()
	for i := 0; cmd != nil && i < 20; i++ {
		msg := cmd()
		if msg == nil {
			return
		}
		_, cmd = m.Update(msg)
		if _, isSnap := msg.(snapMsg); isSnap {
			return // its command is the tick
		}
	}
}

func key(t *testing.T, m *Model, k string) tea.Cmd {
	t.Helper()
	var msg tea.KeyMsg
	switch k {
	case "up":
		msg = tea.KeyMsg{Type: tea.KeyUp}
	case "down":
		msg = tea.KeyMsg{Type: tea.KeyDown}
	case "enter":
		msg = tea.KeyMsg{Type: tea.KeyEnter}
	case "esc":
		msg = tea.KeyMsg{Type: tea.KeyEsc}
	case "ctrl+c":
		msg = tea.KeyMsg{Type: tea.KeyCtrlC}
	default:
		msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
	}
	_, cmd := m.Update(msg)
	return cmd
}

func screen(m *Model) string { return ansi.Strip(m.View()) }

func TestBoardShowsEverySection(t *testing.T) {
	snap := localSnap()
	snap.Runnable = []Row{{ID: "job-next", Stage: "inbox", Repo: "web", Engine: "script", Last: "priority normal"}}
	snap.Shipped = []Row{{ID: "job-done", Stage: "shipped", Repo: "app", Last: "aq/job/job-done"}}
	m := newModel(t, &source{snaps: []*Snapshot{snap}})
	s := screen(m)
	for _, want := range []string{
		"aq board · local", "/home/op/.aq", "inbox 1  building 1  review 1  failed 1",
		"daemon f1 running · slots 1/2 busy · dispatch broker (broker healthy) · heartbeat 4s ago",
		"sandbox full (namespaces+landlock): files, network, processes, stragglers hold; missing: limits (cgroup v1)",
		"RUNNING (1)", "> job-run", "engine", "2m05s", "48.8k tok $0.0396", "→ Edit parse/range.go",
		"RUNNABLE — next for aq run (1)", "job-next", "priority normal",
		"WAITING (1)", "job-wait", "waiting for its deps to ship: job-run",
		"REVIEW / TESTING", "job-rev", "FAILED (1)", "job-bad", "engine_failed: script exited 2",
		"SHIPPED — latest (1)", "job-done", "aq/job/job-done",
		"↑/↓ select · enter log · r requeue · x reject · s ship",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the board lacks %q:\n%s", want, s)
		}
	}
	if n := strings.Count(m.View(), "\n") + 1; n != 40 {
		t.Errorf("%d lines on a 40-line terminal", n)
	}
	// Every job listed can be selected: runnable and shipped ones too.
	var ids []string
	for _, r := range m.selectable() {
		ids = append(ids, r.ID)
	}
	if got := strings.Join(ids, " "); got != "job-run job-next job-wait job-rev job-bad job-done" {
		t.Errorf("selectable rows: %s", got)
	}
}

// TestBoardCursorFollowsItsJob: ↑/↓ move over the rows of every section;
// the cursor stays on its job when a refresh reorders the rows, and moves
// to the first row when its job left the board.
func TestBoardCursorFollowsItsJob(t *testing.T) {
	second := localSnap()
	second.Running = nil
	second.Waiting = append([]Row{{ID: "job-new", Stage: "inbox", Last: "retry backoff"}}, second.Waiting...)
	third := localSnap()
	third.Waiting = nil
	src := &source{snaps: []*Snapshot{localSnap(), second, third}}
	m := newModel(t, src)
	key(t, m, "down")
	if m.selected != "job-wait" {
		t.Fatalf("after ↓: %q", m.selected)
	}
	key(t, m, "down")
	key(t, m, "down")
	key(t, m, "down") // past the end: stays on the last
	if m.selected != "job-bad" {
		t.Fatalf("after 4×↓: %q", m.selected)
	}
	key(t, m, "up")
	key(t, m, "up")
	run(t, m, func() tea.Msg { return tickMsg{} })
	if m.selected != "job-wait" {
		t.Fatalf("after a refresh that reordered rows: %q", m.selected)
	}
	run(t, m, func() tea.Msg { return tickMsg{} })
	if m.selected != "job-run" {
		t.Fatalf("after its job left: %q", m.selected)
	}
	if !strings.Contains(screen(m), "> job-run") {
		t.Fatalf("no cursor:\n%s", screen(m))
	}
}

// TestBoardActionNeedsConfirmation: r, x and s ask y/n first; anything but
// y cancels without acting; y acts, shows the answer and refreshes; an
// action that fails shows its error; ship only applies to review/testing.
func TestBoardActionNeedsConfirmation(t *testing.T) {
	src := &source{snaps: []*Snapshot{localSnap()}}
	m := newModel(t, src)
	key(t, m, "down")
	key(t, m, "down") // job-rev
	key(t, m, "x")
	if s := screen(m); !strings.Contains(s, "reject job job-rev? y/n") {
		t.Fatalf("no confirmation:\n%s", s)
	}
	key(t, m, "n")
	if len(src.acts) != 0 || !strings.Contains(screen(m), "cancelled: reject job-rev") {
		t.Fatalf("acted on n: %v", src.acts)
	}
	reads := src.reads
	key(t, m, "s")
	run(t, m, key(t, m, "y"))
	if len(src.acts) != 1 || src.acts[0] != "ship job-rev" || !strings.Contains(screen(m), "shipd job-rev") || src.reads != reads+1 {
		t.Fatalf("acts %v, reads %d→%d:\n%s", src.acts, reads, src.reads, screen(m))
	}
	key(t, m, "up")
	key(t, m, "up") // job-run
	key(t, m, "s")
	if s := screen(m); !strings.Contains(s, "only a job in review or testing ships; job-run is building") || m.confirm != nil {
		t.Fatalf("ship of a running job:\n%s", s)
	}
	src.actErr = errors.New("the coordinator refused to requeue job job-run (409): busy")
	key(t, m, "r")
	run(t, m, key(t, m, "y"))
	if s := screen(m); !strings.Contains(s, "refused to requeue job job-run (409): busy") {
		t.Fatalf("error not shown:\n%s", s)
	}
}

// TestBoardResize: the board is redrawn to the new size: no line wider
// than the terminal (cut with …), exactly its height, the selected row kept
// on screen.
func TestBoardResize(t *testing.T) {
	snap := localSnap()
	for i := range 30 {
		snap.Failed = append(snap.Failed, Row{ID: "old-" + string(rune('a'+i%26)) + strings.Repeat("x", i), Stage: "failed", Last: strings.Repeat("long reason ", 10)})
	}
	m := newModel(t, &source{snaps: []*Snapshot{snap}})
	m.Update(tea.WindowSizeMsg{Width: 60, Height: 15})
	key(t, m, "G") // the last row
	v := m.View()
	lines := strings.Split(v, "\n")
	if len(lines) != 15 {
		t.Fatalf("%d lines at height 15", len(lines))
	}
	cut := false
	for _, l := range lines {
		if w := ansi.StringWidth(l); w > 60 {
			t.Fatalf("line of width %d at width 60: %q", w, ansi.Strip(l))
		}
		cut = cut || strings.HasSuffix(ansi.Strip(l), "…")
	}
	if !cut || !strings.Contains(ansi.Strip(v), "> old-") {
		t.Fatalf("no cut line, or the selection is off screen:\n%s", ansi.Strip(v))
	}
}

// TestBoardFleet: factories with health and load, alerts, a coordinator
// that lacks the factories route named, and one that went away shown with
// the time since and the data kept.
func TestBoardFleet(t *testing.T) {
	snap := localSnap()
	snap.Mode, snap.Where = "fleet", "coordinator http://127.0.0.1:1/api"
	snap.Fleet = &Fleet{API: "http://127.0.0.1:1/api", Reachable: true, FactoriesKnown: true, FetchedAt: at,
		Factories: []Factory{{ID: "f1", Health: "ok", Running: 1, Seats: 2, Load: 0.5, HeartbeatAge: 3 * time.Second, Jobs: []string{"job-run"}},
			{ID: "f2", Health: "ok", Stale: true, Seats: 1, HeartbeatAge: 5 * time.Minute}},
		Alerts: []string{"factory f2 is stale: no heartbeat for 5m0s"}}
	gone := *snap
	gf := *snap.Fleet
	gf.Reachable, gf.UnreachableSince, gf.Error = false, at.Add(time.Minute), "coordinator unavailable for GET /fleet/queue-state after 3 attempt(s): connection refused"
	gone.Fleet = &gf
	lacking := *snap
	lf := *snap.Fleet
	lf.FactoriesKnown, lf.Factories, lf.Missing = false, nil, []string{"GET /fleet/factories"}
	lacking.Fleet = &lf
	m := newModel(t, &source{snaps: []*Snapshot{snap, &gone, &lacking}})
	s := screen(m)
	for _, want := range []string{"aq board · fleet", "FACTORIES (2)", "f1", "1/2 running  load 0.50  heartbeat 3s ago  [job-run]", "stale", "ALERTS (1)", "! factory f2 is stale"} {
		if !strings.Contains(s, want) {
			t.Errorf("lacks %q:\n%s", want, s)
		}
	}
	run(t, m, func() tea.Msg { return tickMsg{} })
	s = screen(m)
	if !strings.Contains(s, "coordinator unreachable since "+at.Add(time.Minute).Local().Format(time.TimeOnly)) || !strings.Contains(s, "showing what it said at") || !strings.Contains(s, "job-run") {
		t.Errorf("unreachable:\n%s", s)
	}
	run(t, m, func() tea.Msg { return tickMsg{} })
	if s := screen(m); !strings.Contains(s, "the coordinator has no GET /fleet/factories: factories are not shown") || !strings.Contains(s, "job-run") {
		t.Errorf("missing route:\n%s", s)
	}
}

// TestBoardLogViewAndQuit: enter opens the selected job's live log, esc
// goes back, q and ctrl+c quit.
func TestBoardLogViewAndQuit(t *testing.T) {
	src := &source{snaps: []*Snapshot{localSnap()}, follow: []string{"── attempt 1: claude ──", "→ Bash go test ./...", "■ result: success"}, started: make(chan string, 1)}
	m := newModel(t, src)
	cmd := key(t, m, "enter")
	if id := <-src.started; id != "job-run" {
		t.Fatalf("followed %q", id)
	}
	for i := 0; cmd != nil && i < 10; i++ {
		_, cmd = m.Update(cmd())
	}
	s := screen(m)
	if !strings.Contains(s, "aq log  job-run · the job ended") || !strings.Contains(s, "→ Bash go test ./...") || !strings.Contains(s, "■ result: success") {
		t.Fatalf("log view:\n%s", s)
	}
	key(t, m, "esc")
	if m.log != nil || !strings.Contains(screen(m), "RUNNING (1)") {
		t.Fatalf("esc did not go back:\n%s", screen(m))
	}
	if cmd := key(t, m, "q"); cmd == nil || cmd() != tea.Quit() {
		t.Fatal("q does not quit")
	}
	if cmd := key(t, m, "ctrl+c"); cmd == nil || cmd() != tea.Quit() {
		t.Fatal("ctrl+c does not quit")
	}
}

// TestPlain: the plain board has the same content without styles.
func TestPlain(t *testing.T) {
	p := Plain(localSnap(), 2*time.Second, at)
	if strings.Contains(p, "\x1b[") || !strings.Contains(p, "RUNNING (1)") || !strings.Contains(p, "  job-run") || strings.Contains(p, "> job-run") {
		t.Fatalf("plain:\n%s", p)
	}
	// The header says how engines run, below the daemon's slots and source.
	weak := localSnap()
	weak.Sandbox = &Sandbox{Line: "none, AQ_SANDBOX=off", Weak: true}
	lines := strings.Split(Plain(weak, 2*time.Second, at), "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "daemon f1 running") })
	if i < 0 || i+1 >= len(lines) || lines[i+1] != "sandbox none, AQ_SANDBOX=off" {
		t.Fatalf("the header:\n%s", strings.Join(lines, "\n"))
	}
}
