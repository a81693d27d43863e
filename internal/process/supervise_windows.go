//go:build windows

package process

import "io"

// startSupervisor: on Windows the engine's Job Object (KILL_ON_JOB_CLOSE)
// ends the engine's tree when aq dies; no supervisor is needed.
func startSupervisor(string, supervision) (func(), error) { return func() {}, nil }

func supervise(supervision, io.Reader) int { return 0 }
