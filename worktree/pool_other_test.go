//go:build !linux

package worktree

import "testing"

// makeUndeletable: see pool_linux_test.go.
func makeUndeletable(t *testing.T, p string) func() {
	t.Helper()
	return chmodUndeletable(t, p)
}
