// Package wire runs the aq binary against a hostile coordinator (issue
// #26: answers that are not the contract, refused reports, a lost lease,
// a clock behind) and a host that runs out of disk. Tests only; moved
// from cmd/aq/cli so they run beside its in-process tests (#35).
package wire
