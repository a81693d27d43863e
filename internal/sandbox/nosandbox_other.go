//go:build !linux && !darwin && !windows

package sandbox

// noSandboxWhy is why this platform has no sandbox.
const noSandboxWhy = "no sandbox on this platform (docs/sandbox.md)"
