package board

import (
	"context"
	"errors"
	"io"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/aqfleet/aq/internal/termstyle"
)

// Options configure a board.
type Options struct {
	Source   Source
	Interval time.Duration // between refreshes (default 2s)
	// Now is the clock for ages ("3s ago"); nil: time.Now.
	Now func() time.Time
	// Plain draws without colours or styles (--no-color, NO_COLOR,
	// TERM=dumb); the selected row keeps its "> " marker.
	Plain bool
}

// Model is the board's state. Every change comes through Update with a
// message, so tests drive it without a terminal.
type Model struct {
	ctx      context.Context
	src      Source
	interval time.Duration
	now      func() time.Time

	snap          *Snapshot
	width, height int
	refreshing    bool

	// selected is the job the cursor is on, kept by id across refreshes.
	selected string
	// confirm is an action waiting for y/n.
	confirm *pending
	// message is the answer to the last action (err: it failed).
	message string
	err     bool

	log *logView // non-nil: the log view is open

	plain bool // rendering for Plain: no padding to the width
}

// pending is an action the operator is asked to confirm.
type pending struct {
	id, action string
}

// logView is the live log of one job.
type logView struct {
	id     string
	lines  []string
	done   bool
	err    string
	ch     chan logBatch
	cancel context.CancelFunc
	// follow keeps the view at the end; scrolling up stops it.
	offset int // lines hidden below the bottom (0: at the end)
}

// maxLogLines bounds what the log view keeps.
const maxLogLines = 5000

// Messages.
type (
	snapMsg struct{ s *Snapshot }
	tickMsg struct{}
	actMsg  struct {
		msg string
		err error
	}
	logBatch struct {
		lines []string
		done  bool
		err   error
	}
	logMsg struct {
		id string
		b  logBatch
	}
)

// New returns a board model; ctx bounds its reads and actions.
func New(ctx context.Context, o Options) *Model {
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Model{ctx: ctx, src: o.Source, interval: o.Interval, now: o.Now, width: 100, height: 30}
}

// Init starts the first refresh.
func (m *Model) Init() tea.Cmd {
	m.refreshing = true
	return m.fetch()
}

func (m *Model) fetch() tea.Cmd {
	ctx, src := m.ctx, m.src
	return func() tea.Msg { return snapMsg{src.Snapshot(ctx)} }
}

func (m *Model) tick() tea.Cmd {
	return tea.Tick(m.interval, func(time.Time) tea.Msg { return tickMsg{} })
}

// Update handles one message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		return m, nil
	case snapMsg:
		m.snap, m.refreshing = msg.s, false
		m.keepSelection()
		return m, m.tick()
	case tickMsg:
		if m.refreshing {
			return m, nil
		}
		m.refreshing = true
		return m, m.fetch()
	case actMsg:
		m.message, m.err = msg.msg, msg.err != nil
		if msg.err != nil {
			m.message = msg.err.Error()
		}
		if m.refreshing {
			return m, nil
		}
		m.refreshing = true
		return m, m.fetch()
	case logMsg:
		return m, m.onLog(msg)
	case tea.KeyMsg:
		return m.key(msg)
	}
	return m, nil
}

func (m *Model) key(k tea.KeyMsg) (tea.Model, tea.Cmd) {
	s := k.String()
	if s == "ctrl+c" {
		m.closeLog()
		return m, tea.Quit
	}
	if m.log != nil {
		switch s {
		case "q", "esc", "backspace", "left", "h":
			m.closeLog()
		case "up", "k":
			m.log.offset = min(m.log.offset+1, max(0, len(m.log.lines)-1))
		case "down", "j":
			m.log.offset = max(0, m.log.offset-1)
		case "pgup":
			m.log.offset = min(m.log.offset+m.bodyHeight(), max(0, len(m.log.lines)-1))
		case "pgdown":
			m.log.offset = max(0, m.log.offset-m.bodyHeight())
		case "end", "G":
			m.log.offset = 0
		}
		return m, nil
	}
	if p := m.confirm; p != nil {
		m.confirm = nil
		switch s {
		case "y", "Y":
			m.message, m.err = "", false
			return m, m.act(p.id, p.action)
		default:
			m.message, m.err = "cancelled: "+p.action+" "+p.id, false
		}
		return m, nil
	}
	switch s {
	case "q":
		return m, tea.Quit
	case "up", "k":
		m.move(-1)
	case "down", "j":
		m.move(1)
	case "home", "g":
		m.moveTo(0)
	case "end", "G":
		m.moveTo(len(m.selectable()) - 1)
	case "enter", "l":
		if id := m.selected; id != "" {
			return m, m.openLog(id)
		}
	case "r":
		m.ask("requeue")
	case "x":
		m.ask("reject")
	case "s":
		m.ask("ship")
	case "R", "ctrl+r":
		if !m.refreshing {
			m.refreshing = true
			return m, m.fetch()
		}
	}
	return m, nil
}

// ask puts an action up for confirmation, when it can apply.
func (m *Model) ask(action string) {
	r, ok := m.selectedRow()
	if !ok {
		m.message, m.err = "no job selected (↑/↓ to select one)", true
		return
	}
	if action == "ship" && r.Stage != "review" && r.Stage != "testing" {
		m.message, m.err = "only a job in review or testing ships; "+r.ID+" is "+r.Stage, true
		return
	}
	m.confirm = &pending{id: r.ID, action: action}
	m.message, m.err = "", false
}

func (m *Model) act(id, action string) tea.Cmd {
	ctx, src := m.ctx, m.src
	return func() tea.Msg {
		msg, err := src.Act(ctx, id, action)
		return actMsg{msg: msg, err: err}
	}
}

// selectable are the rows the cursor moves over, in screen order.
func (m *Model) selectable() []Row {
	if m.snap == nil {
		return nil
	}
	var out []Row
	out = append(out, m.snap.Running...)
	out = append(out, m.snap.Runnable...)
	out = append(out, m.snap.Waiting...)
	out = append(out, m.snap.Review...)
	out = append(out, m.snap.Failed...)
	out = append(out, m.snap.Shipped...)
	return out
}

func (m *Model) selectedRow() (Row, bool) {
	for _, r := range m.selectable() {
		if r.ID == m.selected {
			return r, true
		}
	}
	return Row{}, false
}

func (m *Model) index() int {
	for i, r := range m.selectable() {
		if r.ID == m.selected {
			return i
		}
	}
	return -1
}

func (m *Model) move(d int) {
	rows := m.selectable()
	if len(rows) == 0 {
		return
	}
	i := m.index()
	if i < 0 {
		i = 0
	} else {
		i = min(max(i+d, 0), len(rows)-1)
	}
	m.selected = rows[i].ID
}

func (m *Model) moveTo(i int) {
	rows := m.selectable()
	if len(rows) == 0 || i < 0 {
		return
	}
	m.selected = rows[min(i, len(rows)-1)].ID
}

// keepSelection keeps the cursor on its job; a job that left the board
// hands the cursor to the first row.
func (m *Model) keepSelection() {
	if m.index() >= 0 {
		return
	}
	m.moveTo(0)
}

// openLog opens the log view of id and starts following it.
func (m *Model) openLog(id string) tea.Cmd {
	m.closeLog()
	ctx, cancel := context.WithCancel(m.ctx)
	lv := &logView{id: id, ch: make(chan logBatch, 64), cancel: cancel}
	m.log = lv
	src := m.src
	go func() {
		defer close(lv.ch)
		err := src.Follow(ctx, id, func(l string) {
			select {
			case lv.ch <- logBatch{lines: []string{l}}:
			case <-ctx.Done():
			}
		})
		if ctx.Err() != nil {
			return
		}
		select {
		case lv.ch <- logBatch{done: true, err: err}:
		case <-ctx.Done():
		}
	}()
	return waitLog(id, lv.ch)
}

// waitLog reads what the follower sent (several lines at once when they
// queued up).
func waitLog(id string, ch chan logBatch) tea.Cmd {
	return func() tea.Msg {
		b, ok := <-ch
		if !ok {
			return logMsg{id: id, b: logBatch{done: true}}
		}
		for len(b.lines) < 256 && !b.done {
			select {
			case more, ok := <-ch:
				if !ok {
					b.done = true
					break
				}
				b.lines = append(b.lines, more.lines...)
				b.done, b.err = more.done, more.err
				continue
			default:
			}
			break
		}
		return logMsg{id: id, b: b}
	}
}

func (m *Model) onLog(msg logMsg) tea.Cmd {
	lv := m.log
	if lv == nil || lv.id != msg.id || lv.done {
		return nil
	}
	lv.lines = append(lv.lines, msg.b.lines...)
	if len(lv.lines) > maxLogLines {
		lv.lines = append([]string{}, lv.lines[len(lv.lines)-maxLogLines:]...)
	}
	if lv.offset > 0 {
		lv.offset += len(msg.b.lines) // stay where the reader scrolled to
	}
	if msg.b.done {
		lv.done = true
		if msg.b.err != nil {
			lv.err = msg.b.err.Error()
		}
		return nil
	}
	return waitLog(lv.id, lv.ch)
}

func (m *Model) closeLog() {
	if m.log != nil {
		m.log.cancel()
		m.log = nil
	}
}

// Run shows the board on a terminal (in and out) until q, Ctrl-C, a
// signal or ctx's end; the terminal is restored on every path.
func Run(ctx context.Context, in io.Reader, out io.Writer, o Options) error {
	if o.Plain {
		termstyle.UsePlain()
	}
	m := New(ctx, o)
	p := tea.NewProgram(m, tea.WithContext(ctx), tea.WithInput(in), tea.WithOutput(out), tea.WithAltScreen())
	_, err := p.Run()
	m.closeLog()
	if errors.Is(err, tea.ErrInterrupted) || errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil
	}
	return err
}
