// Package layers holds no code, only the test that keeps aq's layering
// honest in the fast loop (`make unit`, a plain `go test ./...`): the leaf
// packages — job (the domain types), engines, worktree, profiles and
// internal/* — never import the pipeline (agent/), the commands (cmd/), or
// the demo, selftest and chaos harnesses that sit on top of them. An arrow
// up the layers is how a leaf stops being reusable and starts an import
// cycle. The rule is written once, as the depguard rule "leaves" in
// .golangci.yml (which `make lint` enforces); this test reads it from there.
package layers
