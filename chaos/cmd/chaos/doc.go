// Command chaos runs the fleet's chaos harness (package chaos) and writes
// its report: `make chaos` is
//
//	go run ./chaos/cmd/chaos --out docs/RELIABILITY.md
//
// It builds aq from this module (without -race unless --race), runs the
// full-size run (or --size reduced), prints progress on stderr and exits 0
// when every invariant holds, 1 when one broke, 2 when the harness itself
// could not run.
package main
