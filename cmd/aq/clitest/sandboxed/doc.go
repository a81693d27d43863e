// Package sandboxed runs the aq binary's jobs in their sandbox against a
// hostile engine (docs/sandbox.md's suite: escapes, leftovers, a leaked
// key at ship time; its limits are in cmd/aq/clitest/limits), and the
// sandbox as aq caps, egress and gc see it. Tests only; moved from
// cmd/aq/cli so they run beside its in-process tests (#35).
package sandboxed
