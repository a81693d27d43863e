// Package jobs runs the aq binary's commands on jobs as a user does:
// aq job, status (and the board in tmux), submit, undo, selftest, the
// README's quick start. Tests only; moved from cmd/aq/cli so
// they run beside its in-process tests (#35).
package jobs
