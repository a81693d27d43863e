package abandon

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestMarkAndTake: the jobs Running when aq gives up are marked, each mark
// is taken once by the recovery that names the process that left it, and a
// job that ended before is not marked.
func TestMarkAndTake(t *testing.T) {
	home := t.TempDir()
	doneA := Running(home, "job-a")
	doneB := Running(home, "job-b")
	doneB()
	doneB() // idempotent
	got := Mark("aq run was stopped", 5*time.Second)
	doneA()
	if !slices.Equal(got, []string{"job-a"}) {
		t.Fatalf("marked %v, want [job-a]", got)
	}
	if st, err := os.Stat(filepath.Join(Dir(home), "job-a")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mark: %v %v", st, err)
	}
	if _, ok := Take(home, "job-b", os.Getpid()); ok {
		t.Error("job-b ended before aq gave up, yet it has a mark")
	}
	why, ok := Take(home, "job-a", os.Getpid())
	if !ok || why != "aq run was stopped" {
		t.Fatalf("Take = %q %v", why, ok)
	}
	if _, ok := Take(home, "job-a", os.Getpid()); ok {
		t.Error("a mark was taken twice")
	}
}

// TestTakeIgnoresAnotherProcess: a mark left by another aq process is stale
// (pid reuse, a recovery that already ran): not taken, and removed.
func TestTakeIgnoresAnotherProcess(t *testing.T) {
	home := t.TempDir()
	done := Running(home, "job-c")
	Mark("stopped", 5*time.Second)
	done()
	if _, ok := Take(home, "job-c", os.Getpid()+1); ok {
		t.Fatal("a mark of another process was taken")
	}
	if _, err := os.Stat(filepath.Join(Dir(home), "job-c")); !os.IsNotExist(err) {
		t.Fatalf("the stale mark is still there: %v", err)
	}
}

// TestMarkIsBounded: where the marks cannot be written (here: $AQ_HOME is a
// file), Mark returns none and does not fail.
func TestMarkIsBounded(t *testing.T) {
	home := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(home, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := Running(home, "job-d")
	defer done()
	if got := Mark("stopped", 5*time.Second); len(got) != 0 {
		t.Fatalf("marked %v under a file", got)
	}
}
