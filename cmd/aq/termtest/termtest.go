// Package termtest runs the aq binary in real terminals: a raw pty that
// never answers (no terminal query may reach it: issue #34) and tmux (the
// live block of aq run, the board without colour, narrow terminals). The
// tests live here, beside cmd/aq/cli's long package rather than in it.
package termtest
