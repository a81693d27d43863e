package sandbox

// noSandboxWhy is why this platform has no sandbox yet: the Seatbelt
// profile generated from the Policy is not yet what aq starts engines
// under (docs/sandbox.md, docs/platforms.md).
const noSandboxWhy = "aq does not start engines under the macOS Seatbelt profile yet (docs/sandbox.md)"
