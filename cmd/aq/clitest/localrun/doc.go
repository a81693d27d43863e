// Package localrun runs the aq binary's local mode: `aq run` on real
// repositories with script engines — exit codes, failure reasons,
// retries, signals and kill -9, notifications, traces, parking, shipping
// a PR. Tests only; moved from cmd/aq/cli so they run beside its
// in-process tests (#35).
package localrun
