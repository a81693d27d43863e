// Package abandon carries one fact from an aq that gave up to the aq that
// recovers after it: which jobs it left running, and why. Signals always
// win (#32; cmd/aq/cli, stop.go): once its stop has begun, a command whose
// step does not return (a FIFO, a hung file system, a wedged child) is
// abandoned and aq exits. The jobs it was running are still in building/
// (or in the factory's job records); the next aq recovers them. Without
// this package that recovery cannot tell them from a crash's and fails
// them crash; with it they fail interrupted, saying what was abandoned, as
// docs/contract.md's reasons and docs/troubleshooting.md have it.
//
// The marks live in $AQ_HOME/abandoned/<job id>: aq's own tree, which no
// engine can write.
package abandon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
)

// Dir is where the marks of home are.
func Dir(home string) string { return filepath.Join(home, "abandoned") }

type key struct{ home, id string }

var (
	mu      sync.Mutex
	running = map[key]int{}
)

// Running records that this process runs job id for the aq home home, until
// the returned func is called.
func Running(home, id string) (done func()) {
	k := key{home, id}
	mu.Lock()
	running[k]++
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			if running[k]--; running[k] <= 0 {
				delete(running, k)
			}
		})
	}
}

// mark is a mark's content: the process that abandoned the job (a mark of
// another process is stale), when, and why.
type mark struct {
	PID int       `json:"pid"`
	At  time.Time `json:"at"`
	Why string    `json:"why"`
}

// Mark writes a mark saying why for every job Running in this process, and
// returns the ids it marked. It waits at most within: the file system that
// blocked the step may block these writes too, and aq exits regardless.
func Mark(why string, within time.Duration) []string {
	mu.Lock()
	keys := make([]key, 0, len(running))
	for k := range running {
		keys = append(keys, k)
	}
	mu.Unlock()
	m := mark{PID: os.Getpid(), At: time.Now().UTC(), Why: why}
	type res struct {
		id string
		ok bool
	}
	out := make(chan res, len(keys))
	for _, k := range keys {
		go func() {
			err := os.MkdirAll(Dir(k.home), 0o700)
			if err == nil {
				err = atomicfile.WriteJSON(filepath.Join(Dir(k.home), k.id), m, 0o600)
			}
			out <- res{k.id, err == nil}
		}()
	}
	var ids []string
	t := time.NewTimer(within)
	defer t.Stop()
	for range keys {
		select {
		case r := <-out:
			if r.ok {
				ids = append(ids, r.id)
			}
		case <-t.C:
			return ids
		}
	}
	return ids
}

// Take returns why the aq process pid abandoned job id, when its mark says
// so, and removes the mark either way (one that another process left is
// stale: that process's jobs were recovered already).
func Take(home, id string, pid int) (why string, ok bool) {
	p := filepath.Join(Dir(home), id)
	b, err := os.ReadFile(p)
	if err != nil {
		return "", false
	}
	_ = os.Remove(p)
	var m mark
	if json.Unmarshal(b, &m) != nil || m.PID != pid || m.Why == "" {
		return "", false
	}
	return m.Why, true
}
