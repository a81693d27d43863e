package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/aqfleet/aq/job"
)

func benchQueue(b *testing.B, jobs int, mods ...func(int, *job.Job)) (*Queue, *fakeClock) {
	b.Helper()
	q, clk := newQueue(b)
	for i := range jobs {
		j := mkJob(jobID(i), withPriority(i%4*100+100))
		for _, m := range mods {
			m(i, j)
		}
		mustSubmit(b, q, j)
	}
	return q, clk
}

// BenchmarkNext takes the best of 1,000 inbox jobs and (untimed) puts it back,
// so every iteration sees the same queue. "warm" reuses one Queue (aq run's
// loop); "cold" opens the queue each time (aq run --once).
func BenchmarkNext(b *testing.B) {
	for _, cold := range []bool{false, true} {
		name := "warm"
		if cold {
			name = "cold"
		}
		b.Run(name+"/1000-jobs", func(b *testing.B) {
			q, clk := benchQueue(b, 1000)
			b.ResetTimer()
			for range b.N {
				nq := q
				if cold {
					nq = reopen(b, q, clk)
				}
				e, err := nq.Next(nil)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := q.Move(e.State.ID, job.Inbox, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkSubmit submits a new job. "key" checks an idempotency key against
// 1,000 existing keyed jobs (each submitted job is removed again, untimed, so
// the queue does not grow).
func BenchmarkSubmit(b *testing.B) {
	b.Run("no-key", func(b *testing.B) {
		q, _ := newQueue(b)
		b.ResetTimer()
		for i := range b.N {
			j := mkJob(fmt.Sprintf("bench-%d", i))
			if _, err := q.Submit(j, rawFor(j)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("key/1000-jobs", func(b *testing.B) {
		q, _ := benchQueue(b, 1000, func(i int, j *job.Job) { j.IdempotencyKey = fmt.Sprintf("key-%d", i) })
		b.ResetTimer()
		for i := range b.N {
			j := mkJob("bench", withKey(fmt.Sprintf("new-%d", i)))
			if _, err := q.Submit(j, rawFor(j)); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			for _, f := range []string{"bench.md", "bench.json"} {
				if err := os.Remove(filepath.Join(q.Dir(), "inbox", f)); err != nil && !errors.Is(err, os.ErrNotExist) {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	})
}
