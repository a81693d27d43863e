// Package termstyle keeps aq from asking the terminal anything it does not
// need to know. Bubble Tea's package init asks Lip Gloss whether the
// background is dark, which makes termenv write a background-colour query
// (ESC ] 11 ; ? ESC \) and a cursor-position request (ESC [ 6 n) to the
// terminal and wait up to five seconds for the answers — before main, in
// every aq command and in the re-executed sandbox init — on any terminal
// that does not answer (script, a CI runner's pty, docker exec -t, a serial
// console). aq's board uses no adaptive colours, so the answer is never
// needed: this package's init sets the background explicitly first.
//
// The order is Go's (≥ 1.21): a package is initialised once all it imports
// are, and among the packages ready at once the one whose import path sorts
// first goes first. This package imports only Lip Gloss, which Bubble Tea
// imports too, and its path (github.com/aqfleet/…) sorts before
// github.com/charmbracelet/bubbletea, so its init runs before Bubble Tea's
// wherever both are linked in. TestInitRunsBeforeBubbleTea guards that.
package termstyle

import (
	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"
)

func init() {
	// Explicit: Lip Gloss never queries the terminal for it.
	lipgloss.SetHasDarkBackground(true)
}

// Plain says whether output must carry no colour or style: --no-color
// (flag), NO_COLOR set to anything non-empty (https://no-color.org), or
// TERM=dumb. getenv is os.Getenv in aq.
func Plain(flag bool, getenv func(string) string) bool {
	return flag || getenv("NO_COLOR") != "" || getenv("TERM") == "dumb"
}

// UsePlain makes Lip Gloss render without colours or styles (reverse video,
// bold and faint included), as NO_COLOR does; a view that marks something
// with a style alone must mark it in text too.
func UsePlain() { lipgloss.SetColorProfile(termenv.Ascii) }
