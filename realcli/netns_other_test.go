//go:build !linux

package realcli_test

import "testing"

// netns is Linux's network namespace of the test's own; elsewhere the
// unsandboxed end-to-end tests are skipped (nothing may leave the machine).
type netns struct{}

func newNetns(t *testing.T) *netns {
	t.Helper()
	t.Skip("an unsandboxed real-CLI run needs a network namespace of its own (Linux)")
	return nil
}

func (ns *netns) do(f func()) { f() }
