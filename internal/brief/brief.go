// Package brief makes text short enough for one line of a message: an
// error, a log line, a reason a job failed, a row of a report. It is the one
// place aq cuts text — a tool's first line of output, a multi-line error,
// a commit id — so every message is cut the same way: on a rune boundary,
// with "…" where something was left out.
package brief

import "strings"

// Ellipsis marks where text was cut.
const Ellipsis = "…"

// Clip returns s cut to at most max bytes on a rune boundary, with Ellipsis
// after the cut; s itself when it fits or max <= 0.
func Clip(s string, max int) string {
	if max <= 0 || len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && cut > max-4 && !runeStart(s[cut]) { // a rune is at most 4 bytes
		cut--
	}
	return s[:cut] + Ellipsis
}

func runeStart(b byte) bool { return b&0xC0 != 0x80 }

// OneLine is the whole of s on one line: every run of white space, line
// ends included, becomes one space, and the ends are trimmed. Then Clip.
func OneLine(s string, max int) string {
	return Clip(strings.Join(strings.Fields(s), " "), max)
}

// FirstLine is the first line of s that is not blank, trimmed; then Clip.
// Tools print what matters first: a version, an error.
func FirstLine(s string, max int) string {
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			return Clip(line, max)
		}
	}
	return ""
}

// Head is the first line of s as it is, with " …" when more lines follow:
// a multi-line message (a panic, a tool's report) shown in one line of a
// table or a log without pretending it was all of it.
func Head(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i] + " " + Ellipsis
	}
	return s
}

// SHA is a commit id cut to the 12 hex digits people read and paste.
func SHA(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
