// Package realcli holds the end-to-end tests that run the real engine CLIs
// — pinned in this directory's package.json and lockfile, installed by
// `make realcli` — through whole aq jobs, offline, against the in-tree API
// fakes of internal/fakellm on 127.0.0.1. It has no code of its own: the
// tests are the package (claude_test.go for Claude Code).
package realcli
