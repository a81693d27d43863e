package fleetcheck

import (
	"fmt"
	"io"
	"strings"
)

// Render writes the report as `aq fleet check` prints it: one line per
// route or rule under its docs/contract.md section — the route or rule, the
// verdict, and what was seen and what aq does about it — then the counts
// and what stays on the coordinator.
func Render(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "aq fleet check of %s\n", r.API)
	fmt.Fprintf(&b, "as factory %s, product %s, repository %s", r.FactoryID, r.ProductID, r.Repo)
	if len(r.Jobs) > 0 {
		fmt.Fprintf(&b, "; jobs %s", strings.Join(r.Jobs, ", "))
	}
	b.WriteString("\n")
	width := 0
	for _, row := range r.Rows {
		width = max(width, len(row.Check))
	}
	section := ""
	for _, row := range r.Rows {
		if row.Section != section {
			section = row.Section
			fmt.Fprintf(&b, "\n%s\n", section)
		}
		line := fmt.Sprintf("  %-*s  %-11s  %s", width, row.Check, row.Verdict, says(row))
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	fmt.Fprintf(&b, "\n%d present, %d missing (aq falls back), %d wrong, %d not checked\n",
		r.Count(Present), r.Count(Missing), r.Count(Wrong), r.Count(Unchecked))
	if r.Incomplete != "" {
		fmt.Fprintf(&b, "the check stopped early: %s\n", r.Incomplete)
	}
	if len(r.GivenBack) > 0 {
		fmt.Fprintf(&b, "a claim handed the check jobs not its own, each given back at once, unstarted: %s\n", strings.Join(r.GivenBack, "; "))
	}
	if len(r.Left) > 0 {
		var left []string
		for _, l := range r.Left {
			left = append(left, fmt.Sprintf("%s %s (%s)", l.Kind, l.ID, l.State))
		}
		fmt.Fprintf(&b, "left on the coordinator: %s\n", strings.Join(left, "; "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// says is a row's last column: what was seen, and what aq does about it.
func says(r Row) string {
	switch {
	case r.AQ == "":
		return r.Seen
	case r.Seen == "":
		return "aq: " + r.AQ
	}
	return r.Seen + " — aq: " + r.AQ
}
