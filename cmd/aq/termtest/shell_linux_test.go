//go:build !unit

package termtest

import "strings"

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shellLine is a command line that runs args in dir (the environment is
// the session's).
func shellLine(dir string, args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return "cd " + shellQuote(dir) + " && " + strings.Join(q, " ")
}
