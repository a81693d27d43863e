package board

import (
	"fmt"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
)

var (
	titleStyle = lipgloss.NewStyle().Bold(true).Reverse(true)
	headStyle  = lipgloss.NewStyle().Bold(true)
	selStyle   = lipgloss.NewStyle().Reverse(true)
	errStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("9")).Bold(true)
	warnStyle  = lipgloss.NewStyle().Foreground(lipgloss.Color("11"))
	dimStyle   = lipgloss.NewStyle().Faint(true)
	okStyle    = lipgloss.NewStyle().Foreground(lipgloss.Color("10"))
)

// line is one screen line and whether it is the selected row.
type line struct {
	text string
	sel  bool
}

// View renders the board (or the log view) to fit the terminal.
func (m *Model) View() string {
	w, h := max(m.width, 20), max(m.height, 5)
	if m.log != nil {
		return m.viewLog(w, h)
	}
	head := m.headLines(w)
	foot := m.footLines()
	body := m.bodyLines(true)
	room := max(h-len(head)-len(foot), 1)
	// Scroll the body so the selected row is on screen.
	sel := -1
	for i, l := range body {
		if l.sel {
			sel = i
		}
	}
	start := 0
	if len(body) > room {
		if sel >= room {
			start = min(sel-room/2, len(body)-room)
		}
		if start+room < len(body) {
			body = body[start : start+room-1]
			body = append(body, line{text: dimStyle.Render(fmt.Sprintf("  … %d more line(s) (↑/↓ scrolls)", len(m.bodyLines(true))-start-room+1))})
		} else {
			body = body[start:]
		}
	}
	var b strings.Builder
	for _, l := range head {
		b.WriteString(fit(l, w) + "\n")
	}
	for _, l := range body {
		t := fit(l.text, w)
		if l.sel {
			t = selStyle.Render(ansi.Strip(t) + strings.Repeat(" ", max(0, w-ansi.StringWidth(ansi.Strip(t)))))
		}
		b.WriteString(t + "\n")
	}
	for i := len(head) + len(body); i < h-len(foot); i++ {
		b.WriteString("\n")
	}
	for i, l := range foot {
		b.WriteString(fit(l, w))
		if i < len(foot)-1 {
			b.WriteString("\n")
		}
	}
	return b.String()
}

func (m *Model) bodyHeight() int { return max(m.height-4, 1) }

// fit cuts s to width w (… marks the cut).
func fit(s string, w int) string {
	if ansi.StringWidth(s) <= w {
		return s
	}
	return ansi.Truncate(s, w, "…")
}

func (m *Model) headLines(w int) []string {
	s := m.snap
	title := " aq board "
	where := ""
	if s != nil {
		title += "· " + s.Mode + " "
		where = s.Where
	}
	clock := m.now().Local().Format(time.TimeOnly)
	right := fmt.Sprintf(" %s · every %s ", clock, m.interval)
	if m.refreshing {
		right = " refreshing…" + right
	}
	top := titleStyle.Render(title) + " " + where
	pad := w - ansi.StringWidth(top) - ansi.StringWidth(right)
	if m.plain {
		pad = 2
	}
	if pad > 0 {
		top += strings.Repeat(" ", pad) + dimStyle.Render(right)
	}
	lines := []string{top}
	if s == nil {
		return append(lines, dimStyle.Render("reading…"))
	}
	if s.Err != "" {
		lines = append(lines, errStyle.Render("! "+s.Err))
	}
	if len(s.Stages) > 0 {
		var parts []string
		for _, c := range s.Stages {
			p := fmt.Sprintf("%s %d", c.Stage, c.N)
			if c.N > 0 && (c.Stage == "failed" || c.Stage == "dead_letter") {
				p = warnStyle.Render(p)
			}
			parts = append(parts, p)
		}
		lines = append(lines, strings.Join(parts, "  "))
	}
	if d := s.Daemon; d != nil {
		lines = append(lines, daemonLine(d))
	}
	if sb := s.Sandbox; sb != nil {
		l := "sandbox " + sb.Line
		if sb.Weak {
			l = warnStyle.Render(l)
		}
		lines = append(lines, l)
	}
	if f := s.Fleet; f != nil && !f.Reachable {
		since := f.UnreachableSince.Local().Format(time.TimeOnly)
		msg := "coordinator unreachable since " + since
		if !f.FetchedAt.IsZero() {
			msg += " (showing what it said at " + f.FetchedAt.Local().Format(time.TimeOnly) + ")"
		}
		msg += ": " + f.Error
		lines = append(lines, errStyle.Render("! "+msg))
	}
	return lines
}

func daemonLine(d *Daemon) string {
	if !d.Alive {
		when := ""
		if !d.Stopped.IsZero() {
			when = " (last seen " + d.Stopped.Local().Format(time.DateTime) + ")"
		}
		return dimStyle.Render("daemon " + d.FactoryID + ": not running" + when)
	}
	hb := "no heartbeat yet"
	if d.HeartbeatAge > 0 {
		hb = "heartbeat " + ago(d.HeartbeatAge)
	}
	if !d.Healthy {
		hb = warnStyle.Render(hb + " (unhealthy)")
	}
	src := d.Source
	if d.Broker != "" {
		src += " (broker " + d.Broker + ")"
	}
	if d.Gate {
		src += ", gated"
	}
	return fmt.Sprintf("daemon %s %s · slots %d/%d busy · dispatch %s · %s", d.FactoryID, d.Stage, d.Busy, d.Slots, src, hb)
}

// bodyLines are the sections; the selected row is marked.
func (m *Model) bodyLines(mark bool) []line {
	s := m.snap
	if s == nil {
		return nil
	}
	var out []line
	add := func(t string) { out = append(out, line{text: t}) }
	section := func(title string, rows []Row, render func(Row) string) {
		add("")
		add(headStyle.Render(fmt.Sprintf("%s (%d)", title, len(rows))))
		if len(rows) == 0 {
			add(dimStyle.Render("  none"))
		}
		for _, r := range rows {
			sel := mark && r.ID == m.selected
			prefix := "  "
			if sel {
				prefix = "> "
			}
			out = append(out, line{text: prefix + render(r), sel: sel})
		}
	}
	if f := s.Fleet; f != nil {
		add("")
		head := fmt.Sprintf("FACTORIES (%d)", len(f.Factories))
		if !f.FactoriesKnown {
			head = "FACTORIES"
		}
		add(headStyle.Render(head))
		if !f.FactoriesKnown {
			add(warnStyle.Render("  the coordinator has no GET /fleet/factories: factories are not shown"))
		}
		for _, fa := range f.Factories {
			st := okStyle.Render(fa.Health)
			if fa.Stale {
				st = errStyle.Render("stale")
			} else if fa.Health != "ok" {
				st = warnStyle.Render(fa.Health)
			}
			hb := "never"
			if fa.HeartbeatAge >= 0 {
				hb = ago(fa.HeartbeatAge)
			}
			jobs := ""
			if len(fa.Jobs) > 0 {
				jobs = "  [" + strings.Join(fa.Jobs, " ") + "]"
			}
			add(fmt.Sprintf("  %-20s %s  %d/%d running  load %.2f  heartbeat %s%s", fa.ID, st, fa.Running, fa.Seats, fa.Load, hb, jobs))
		}
		if len(f.Alerts) > 0 {
			add("")
			add(headStyle.Render(fmt.Sprintf("ALERTS (%d)", len(f.Alerts))))
			for _, a := range f.Alerts {
				add(warnStyle.Render("  ! " + a))
			}
		}
		for _, miss := range f.Missing {
			if miss == "GET /fleet/factories" {
				continue
			}
			add(warnStyle.Render("  the coordinator has no " + miss + ": what it would show is missing"))
		}
	}
	section("RUNNING", s.Running, func(r Row) string {
		usage := "-"
		if r.HasUsage {
			cost := fmt.Sprintf("$%.4f", r.Cost)
			if r.CostEstimated {
				cost = "~" + cost
			}
			usage = fmt.Sprintf("%s tok %s", count(r.Tokens), cost)
		}
		where := r.Phase
		if r.Factory != "" {
			where += " on " + r.Factory
		}
		return fmt.Sprintf("%-24s %-12s %-7s %-18s %8s  %-20s %s", r.ID, r.Repo, orDash(r.Engine), where, dur(r.Elapsed), usage, r.Last)
	})
	if s.Fleet == nil {
		section("RUNNABLE — next for aq run", s.Runnable, func(r Row) string {
			return fmt.Sprintf("%-24s %-12s %-7s %s", r.ID, r.Repo, orDash(r.Engine), r.Last)
		})
	}
	section("WAITING", s.Waiting, func(r Row) string {
		return fmt.Sprintf("%-24s %-8s %s", r.ID, r.Stage, r.Last)
	})
	section("REVIEW / TESTING — s ships", s.Review, func(r Row) string {
		return fmt.Sprintf("%-24s %-8s %-12s %s", r.ID, r.Stage, r.Repo, r.Last)
	})
	section("FAILED", s.Failed, func(r Row) string {
		return fmt.Sprintf("%-24s %-12s attempt %d  %s", r.ID, r.Stage, r.Attempts, r.Last)
	})
	section("SHIPPED — latest", s.Shipped, func(r Row) string {
		return fmt.Sprintf("%-24s %-12s %s", r.ID, r.Repo, r.Last)
	})
	for _, n := range s.Notes {
		add(dimStyle.Render("· " + n))
	}
	return out
}

func (m *Model) footLines() []string {
	var status string
	switch {
	case m.confirm != nil:
		status = warnStyle.Render(fmt.Sprintf("%s job %s? y/n", m.confirm.action, m.confirm.id))
	case m.message != "" && m.err:
		status = errStyle.Render(m.message)
	case m.message != "":
		status = okStyle.Render(m.message)
	}
	help := "↑/↓ select · enter log · r requeue · x reject · s ship · R refresh · q quit"
	if m.width < 80 && !m.plain {
		help = "↑/↓ · enter log · r/x/s requeue/reject/ship · q quit"
	}
	help = dimStyle.Render(help)
	return []string{status, help}
}

func (m *Model) viewLog(w, h int) string {
	lv := m.log
	state := "following"
	if lv.done {
		state = "the job ended"
		if lv.err != "" {
			state = "stopped: " + lv.err
		}
	}
	if lv.offset > 0 {
		state += fmt.Sprintf(" · scrolled up %d line(s) (End follows)", lv.offset)
	}
	top := titleStyle.Render(" aq log ") + " " + lv.id + " · " + state
	room := max(h-2, 1)
	end := len(lv.lines) - lv.offset
	start := max(0, end-room)
	var b strings.Builder
	b.WriteString(fit(top, w) + "\n")
	n := 0
	for _, l := range lv.lines[start:max(end, start)] {
		b.WriteString(fit(l, w) + "\n")
		n++
	}
	for ; n < room; n++ {
		b.WriteString("\n")
	}
	b.WriteString(fit(dimStyle.Render("↑/↓ scroll · esc/q back to the board · ctrl+c quit"), w))
	return b.String()
}

// ago is a duration as "3s ago".
func ago(d time.Duration) string { return dur(d) + " ago" }

func dur(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	d = d.Round(time.Second)
	h, mi, s := int(d/time.Hour), int(d/time.Minute)%60, int(d/time.Second)%60
	switch {
	case h > 0:
		return fmt.Sprintf("%dh%02dm", h, mi)
	case mi > 0:
		return fmt.Sprintf("%dm%02ds", mi, s)
	}
	return fmt.Sprintf("%ds", s)
}

func count(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprint(n)
	case n < 1_000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1fM", float64(n)/1e6)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Plain renders a snapshot as text without styles or selection: the board
// `aq status --watch` prints when its output is not a terminal.
func Plain(s *Snapshot, interval time.Duration, now time.Time) string {
	m := &Model{snap: s, interval: interval, now: func() time.Time { return now }, width: 1 << 16, height: 1 << 16, plain: true}
	var b strings.Builder
	for _, l := range m.headLines(1 << 16) {
		b.WriteString(strings.TrimRight(ansi.Strip(l), " ") + "\n")
	}
	for _, l := range m.bodyLines(false) {
		b.WriteString(strings.TrimRight(ansi.Strip(l.text), " ") + "\n")
	}
	return b.String()
}
