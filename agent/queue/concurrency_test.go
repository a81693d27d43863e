package queue

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// childEnv makes the test binary act as a second `aq run` process: it opens
// the queue named by the variable, waits for the start file, then takes jobs
// until none is left, printing each id it took and shipping it.
const childEnv = "AQ_QUEUE_TEST_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(childNext(dir))
	}
	os.Exit(m.Run())
}

func childNext(dir string) int {
	q, err := Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "..", "go")); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for {
		e, err := q.Next(nil)
		if errors.Is(err, ErrNoJob) {
			return 0
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "Next:", err)
			return 1
		}
		fmt.Fprintln(out, e.State.ID)
		if err := q.Finish(e.State.ID, job.Shipped, nil); err != nil {
			fmt.Fprintln(os.Stderr, "Finish:", err)
			return 1
		}
	}
}

// checkExactlyOnce fails unless taken holds every id in 0..n-1 exactly once.
func checkExactlyOnce(t *testing.T, taken []string, n int) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range taken {
		seen[id]++
		if seen[id] == 2 {
			t.Errorf("job %s handed out twice", id)
		}
	}
	for i := range n {
		if id := jobID(i); seen[id] == 0 {
			t.Errorf("job %s never handed out", id)
		}
	}
	if len(taken) != n {
		t.Errorf("handed out %d jobs, want %d", len(taken), n)
	}
}

func jobID(i int) string { return fmt.Sprintf("job-%04d", i) }

func TestConcurrentNextGoroutines(t *testing.T) {
	testenv.Slow(t, "races many goroutines over the queue")
	const jobs, workers = 120, 16
	tests := []struct {
		name   string
		shared bool // one *Queue for all goroutines, or one each (separate lock fds)
	}{
		{"shared queue", true},
		{"queue per goroutine", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk := newQueue(t)
			for i := range jobs {
				mustSubmit(t, q, mkJob(jobID(i), withPriority(i%5*100)))
			}
			var (
				mu    sync.Mutex
				taken []string
				wg    sync.WaitGroup
			)
			for w := range workers {
				wq := q
				if !tt.shared {
					wq = reopen(t, q, clk, WithOwner("testhost", 5000+w))
				}
				wg.Go(func() {
					for {
						e, err := wq.Next(nil)
						if errors.Is(err, ErrNoJob) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						taken = append(taken, e.State.ID)
						mu.Unlock()
						if err := wq.Finish(e.State.ID, job.Shipped, nil); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			checkExactlyOnce(t, taken, jobs)
			for i := range jobs {
				if st := sidecarOnDisk(t, q, job.Shipped, jobID(i)); st.Attempts != 1 {
					t.Errorf("%s attempts = %d", st.ID, st.Attempts)
				}
			}
		})
	}
}

// Two separate processes (the test binary re-executed) drain one queue: every
// job is handed out exactly once.
func TestConcurrentNextProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	const jobs, procs = 150, 2
	q, _ := newQueue(t)
	for i := range jobs {
		mustSubmit(t, q, mkJob(jobID(i)))
	}
	type child struct {
		cmd    *exec.Cmd
		stdout bytes.Buffer
		stderr bytes.Buffer
	}
	var children []*child
	for range procs {
		c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		c.cmd.Env = append(os.Environ(), childEnv+"="+q.Dir())
		c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
	}
	// Release both at once so their Next calls overlap.
	if err := os.WriteFile(filepath.Join(q.Dir(), "..", "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var taken []string
	perChild := map[int]int{}
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, c.stderr.String())
		}
		for _, line := range strings.Fields(c.stdout.String()) {
			taken = append(taken, line)
			perChild[c.cmd.Process.Pid]++
		}
	}
	checkExactlyOnce(t, taken, jobs)
	t.Logf("jobs per process: %v", perChild)
	for i := range jobs {
		st := sidecarOnDisk(t, q, job.Shipped, jobID(i))
		if st.Attempts != 1 || st.PID == 0 || st.Host == "" {
			t.Errorf("%s: %+v", st.ID, st)
		}
	}
}

// Lock-free reads while jobs move: no errors, no job twice, each entry
// consistent with its manifest's location. The movers take a move from a
// round's allowance (two per job): moving without pause, two movers could
// hold the queue's lock so long on a loaded machine that the reads' locked
// fallback waited a minute; the allowance bounds the work, not the overlap.
func TestReadsDuringMoves(t *testing.T) {
	testenv.Slow(t, "moves files under many concurrent reads")
	const jobs = 30
	q, _ := newQueue(t)
	for i := range jobs {
		mustSubmit(t, q, mkJob(jobID(i), withRetry(1000)))
	}
	stop := make(chan struct{})
	allowance := make(chan struct{}, 2*jobs)
	var moved atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wq := q
		if w == 1 {
			wq = reopen(t, q, &fakeClock{t: t0})
		}
		wg.Go(func() { // movers: inbox -> building -> inbox, over and over
			for {
				select {
				case <-stop:
					return
				case <-allowance:
				}
				e, err := wq.Next(nil)
				if errors.Is(err, ErrNoJob) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if err := wq.Move(e.State.ID, job.Inbox, func(s *State) { s.NotBefore = time.Time{} }); err != nil {
					t.Error(err)
					return
				}
				moved.Add(1)
			}
		})
	}
	for range 100 {
		for len(allowance) < cap(allowance) { // this round's moves
			allowance <- struct{}{}
		}
		list, err := q.List()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range list {
			if seen[e.State.ID] {
				t.Fatalf("List shows %s twice", e.State.ID)
			}
			seen[e.State.ID] = true
			if e.State.Reason == job.ReasonInvalidManifest {
				t.Fatalf("a move in progress looked like corruption: %+v", e.State)
			}
		}
		for i := range jobs {
			id := jobID(i)
			e, err := q.Get(id)
			if err != nil {
				t.Fatalf("Get(%s) during moves: %v", id, err)
			}
			if e.State.ID != id || filepath.Base(filepath.Dir(e.ManifestPath)) != string(e.State.Stage) {
				t.Fatalf("inconsistent entry %+v", e)
			}
		}
	}
	close(stop)
	wg.Wait()
	if moved.Load() == 0 {
		t.Fatal("no job moved while the reads ran")
	}
	// Nothing was lost: every job is in exactly one stage.
	for i := range jobs {
		stageOf(t, q, jobID(i))
	}
}
