package process

// The kill ladder per platform family, in order: what a stopped run's group
// is sent, Run's grace apart; the last step ends whatever is left. The
// platform files send them (process_unix.go: signals to the POSIX group;
// process_windows.go: CTRL_BREAK to the console group, then
// TerminateJobObject — Windows has no SIGTERM between the two). Kept here,
// platform-free, so the ladder's walk is tested on every platform.
var (
	unixLadder    = []string{"SIGINT", "SIGTERM", "SIGKILL"}
	windowsLadder = []string{"CTRL_BREAK", "TerminateJobObject"}
)
