// Package limits runs the hostile-engine suite's limits (#32 item 4): real
// sandboxed jobs of the aq binary whose engine takes what it can — memory,
// processes, disk, output — bounded by the job's limits. Tests only; moved
// from cmd/aq/cli so they run beside its in-process tests and the other
// binary tests (#35).
package limits
