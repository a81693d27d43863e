// Package demo holds what the two acts of `aq demo` (demo/local and
// demo/fleetdemo) share: the expected events each act checks, how they are
// printed, and where the local AMQP peer (demo/sbpeer) is, which the
// selftest's broker checks look for too.
package demo

import (
	"fmt"
	"io"
)

// Check is one expected event.
type Check struct {
	What string `json:"what"`
	OK   bool   `json:"ok"`
	Note string `json:"note,omitempty"`
}

// Passed counts the checks that passed.
func Passed(cs []Check) int {
	n := 0
	for _, c := range cs {
		if c.OK {
			n++
		}
	}
	return n
}

// AllPassed reports whether there are checks and every one passed.
func AllPassed(cs []Check) bool { return len(cs) > 0 && Passed(cs) == len(cs) }

// WriteChecks prints one line a check: ok or FAIL, what was expected, and
// the note after a dash.
func WriteChecks(w io.Writer, cs []Check) {
	for _, c := range cs {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		line := "   " + mark + " " + c.What
		if c.Note != "" {
			line += " — " + c.Note
		}
		fmt.Fprintln(w, line)
	}
}
