// Package localrun runs the aq binary's local mode: `aq run` on real
// repositories with script engines — concurrent runs, retries, secrets
// masked, notifications, traces, parking, shipping a PR (its failure paths
// are in cmd/aq/clitest/runfail). Tests only; moved from cmd/aq/cli so they
// run beside its in-process tests (#35).
package localrun
