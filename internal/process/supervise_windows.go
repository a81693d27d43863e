//go:build windows

package process

import "io"

// supervisor: on Windows the engine's Job Object (KILL_ON_JOB_CLOSE) ends
// the engine's tree when aq dies; no supervisor process is needed.
type supervisor struct{}

func startSupervisor(string, supervision) (*supervisor, error) { return &supervisor{}, nil }
func (*supervisor) watch(int)                                  {}
func (*supervisor) done()                                      {}

func supervise(supervision, io.Reader) int { return 0 }
