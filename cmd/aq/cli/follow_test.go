package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/job"
)

// TestLocalWatchWaitsForAMoveToLand: a job caught halfway through its move
// to an ended stage (the manifest moved, the new sidecar not yet written:
// queue.Get shows the new stage with the history from before it) has not
// ended for `aq job logs -f` until its history reaches that stage, so the
// last stage change is shown; a move that never lands (interrupted) ends
// the follow anyway after landedPolls.
func TestLocalWatchWaitsForAMoveToLand(t *testing.T) {
	dir := t.TempDir()
	q, err := queue.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const id = "follow-1"
	j := &job.Job{ID: id, Title: "follow", Repo: "app", Base: "main", Engine: "script",
		Priority: job.PriorityNormal, PriorityName: "normal", DepsMode: "all", Ship: "branch", Body: "do it"}
	if _, err := q.Submit(j, []byte("---\nrepo: app\n---\ndo it\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Next(nil); err != nil {
		t.Fatal(err)
	}
	sidecar := func(stage job.Stage) string { return filepath.Join(dir, string(stage), id+".json") }
	building, err := os.ReadFile(sidecar(job.Building))
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Move(id, job.Shipped, nil); err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(sidecar(job.Shipped))
	if err != nil {
		t.Fatal(err)
	}
	halfway := func() {
		t.Helper()
		if err := os.Remove(sidecar(job.Shipped)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(sidecar(job.Building), building, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	halfway()

	ctx := context.Background()
	w := &localWatch{q: q, id: id}
	lines, ended, err := w.Poll(ctx)
	if err != nil || ended || len(lines) != 2 || !strings.Contains(lines[1], "inbox → building") {
		t.Fatalf("halfway through the move: ended %v, lines %q, err %v", ended, lines, err)
	}
	// The move lands.
	if err := os.WriteFile(sidecar(job.Shipped), shipped, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sidecar(job.Building)); err != nil {
		t.Fatal(err)
	}
	lines, ended, err = w.Poll(ctx)
	if err != nil || !ended || len(lines) != 1 || !strings.Contains(lines[0], "building → shipped") {
		t.Fatalf("after the move: ended %v, lines %q, err %v", ended, lines, err)
	}

	// A move that never lands: the follow ends after landedPolls.
	halfway()
	w = &localWatch{q: q, id: id}
	for i := range landedPolls {
		if _, ended, err := w.Poll(ctx); err != nil || ended {
			t.Fatalf("poll %d of an interrupted move: ended %v, err %v", i, ended, err)
		}
	}
	if _, ended, err := w.Poll(ctx); err != nil || !ended {
		t.Fatalf("an interrupted move is followed forever: ended %v, err %v", ended, err)
	}
}
