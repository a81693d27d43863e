package sandbox

// noSandboxWhy is why this platform has no sandbox: AQ_SANDBOX=auto runs
// engines unsandboxed (and says so at start), AQ_SANDBOX=on refuses every
// job (docs/sandbox.md).
const noSandboxWhy = "Windows has no sandbox aq can use (docs/sandbox.md)"
