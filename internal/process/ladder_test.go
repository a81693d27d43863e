package process

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// stepGroup is a group that records the ladder's steps and ends its
// processes at step exitAt (-1: never; the last step ends it anyway).
type stepGroup struct {
	mu     sync.Mutex
	steps  []int
	exitAt int
	exited chan struct{}
	once   sync.Once
}

func (g *stepGroup) step(i int) {
	g.mu.Lock()
	g.steps = append(g.steps, i)
	g.mu.Unlock()
	if i == g.exitAt {
		g.once.Do(func() { close(g.exited) })
	}
}
func (g *stepGroup) kill()  {}
func (g *stepGroup) close() {}

// The ladder's walk on each platform's steps — Windows's CTRL_BREAK then
// TerminateJobObject, Unix's SIGINT, SIGTERM, SIGKILL — runs here on every
// platform: each step in order, a grace apart, stopping at the step the
// group ends at; nothing when the group ended before the stop.
func TestLadderWalk(t *testing.T) {
	for _, c := range []struct {
		name      string
		steps     []string
		exitAt    int // -1: never
		stopFirst bool
		want      []int
		last      string
	}{
		{"windows: an engine that ignores CTRL_BREAK", windowsLadder, -1, true, []int{0, 1}, "TerminateJobObject"},
		{"windows: an engine that ends on CTRL_BREAK", windowsLadder, 0, true, []int{0}, "CTRL_BREAK"},
		{"unix: ends on SIGTERM", unixLadder, 1, true, []int{0, 1}, "SIGTERM"},
		{"unix: ignores everything but SIGKILL", unixLadder, -1, true, []int{0, 1, 2}, "SIGKILL"},
		{"ended on its own before the stop", unixLadder, -1, false, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &stepGroup{exitAt: c.exitAt, exited: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			if c.stopFirst {
				cancel()
			} else {
				close(g.exited)
				defer cancel()
			}
			var l ladder
			done := make(chan struct{})
			go func() { defer close(done); l.run(ctx, g, c.steps, time.Millisecond, g.exited) }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Fatal("the ladder did not end (a deadlock guard)")
			}
			if !slices.Equal(g.steps, c.want) || l.step != c.last {
				t.Fatalf("steps %v (last %q), want %v (last %q)", g.steps, l.step, c.want, c.last)
			}
		})
	}
}
