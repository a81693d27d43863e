// Package runfail runs the aq binary's local mode where it fails or is
// stopped: exit codes and failure reasons, kill -9 and signals mid-job,
// an unwritable home, bad manifests and queue problems, a wait on a lock
// or a FIFO. Tests only; moved from cmd/aq/cli so they run beside its
// in-process tests and the other binary tests (#35).
package runfail
