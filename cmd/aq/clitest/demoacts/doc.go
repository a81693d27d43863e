// Package demoacts runs the built binary's `aq demo` — both acts, their
// factories as real `aq daemon` processes — and its flags. Tests only;
// moved from cmd/aq/cli so they run beside its in-process tests and the
// other binary tests (#35): the whole demo is the longest single test.
package demoacts
