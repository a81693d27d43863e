// Package fleet runs the aq binary as a fleet factory: `aq daemon` and
// `aq run` replicas against the coordinator stub and the local AMQP peer,
// signalled and killed as an operator or systemd would; sessions; live
// logs followed from another host; the daemon's idle benchmark. Tests
// only; moved from cmd/aq/cli so they run beside its in-process tests
// (#35).
package fleet
