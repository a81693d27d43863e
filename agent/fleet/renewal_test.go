package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestNoRenewalRacesTheTerminalReport: a renewal that is due at the moment
// the job's terminal report goes out never reaches the coordinator after
// the report — the report ends the lease (/fleet/fail frees it at once),
// and a renewal behind it is refused ("nobody holds its lease") and lands in
// the coordinator's audit trail as a fenced write, which is what an
// operator's alert watches for. The hook holds a renewal on its way to the
// wire while the job ends; the stub holds the terminal report's answer until
// that renewal has reached it, so the renewal cannot be cancelled by the
// run's end before it is sent: only the lifecycle's order decides whether it
// lands before the report (allowed: the lease is still held) or after it.
func TestNoRenewalRacesTheTerminalReport(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		r := &reportRace{released: make(chan struct{}), renewDone: make(chan struct{}), reportTaken: make(chan struct{}),
			held: make(chan struct{}), reportWaits: make(chan struct{})}
		s := startStubBehind(t, rs.opts(coord.Options{LeaseTTL: time.Hour, ReapEvery: time.Hour, MaxBackoff: time.Millisecond}), r.wrap)
		w := newWorld(t, "app")
		id := testenv.ID("renewal-race")
		started, goFile := filepath.Join(w.dir, "started"), filepath.Join(w.dir, "go")
		script := w.script("fails-when-told", fmt.Sprintf("touch %q\nwhile [ ! -f %q ]; do sleep 0.02; done\nexit 3\n", started, goFile))
		s.submit(t, id, "app", "script: "+script+"\nretry: { max: 2 }")
		f := newFactory(t, s, w, "first")
		f.Agent.Jobs.LeaseHooks = &LeaseHooks{Renewing: r.renewing, ReportWaits: r.waits}

		type ran struct {
			res *Result
			err error
		}
		done := make(chan ran, 1)
		go func() {
			res, err := f.runOnce(t, ctxT(t))
			done <- ran{res, err}
		}()
		waitFile(t, started, done)
		r.armed.Store(true) // the next renewal is held on its way to the wire
		select {
		case <-r.held:
		case got := <-done:
			t.Fatalf("the job ended before a renewal was held: %+v %v", got.res, got.err)
		}
		testenv.WriteFile(t, goFile, "") // the engine fails now: the terminal report follows
		// Let the held renewal go once the report is on the wire (taken by
		// the stub), or once the report waits for the renewal to end.
		select {
		case <-r.reportTaken:
		case <-r.reportWaits:
		}
		r.release.Store(true)
		close(r.released)
		got := <-done
		if got.err != nil {
			t.Fatal(got.err)
		}
		if got.res.Outcome.Reason != job.ReasonEngineFailed || got.res.Report != "delivered" || got.res.Stage != job.Inbox {
			t.Fatalf("result %+v", got.res)
		}
		evs := s.Events(id)
		for _, e := range evs {
			if e.Kind == "fenced" {
				t.Errorf("the coordinator refused %s from %s after the job's terminal report: %s (events %v)", e.Call, e.Factory, e.Detail, kinds(evs))
			}
		}
		want := []string{"submitted", "claimed", "stage:building", "fail:queued"}
		if rs.legacy() {
			want = []string{"submitted", "claimed", "stage:building", "stage:queued", "released"}
		}
		if got := kinds(evs); !slices.Equal(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		if j, _ := s.Job(id); j.Holder != "" || j.Stage != coord.StageQueued {
			t.Fatalf("after the report: %+v", j)
		}
	})
}

// reportRace holds one renewal and the terminal report's answer (see
// TestNoRenewalRacesTheTerminalReport).
type reportRace struct {
	armed, release atomic.Bool
	heldOnce       sync.Once
	held           chan struct{} // a renewal is held by the hook
	released       chan struct{} // the hook lets it go
	renewDone      chan struct{} // the held renewal reached the stub and was answered
	renewOnce      sync.Once
	reportTaken    chan struct{} // the stub took the terminal report
	takenOnce      sync.Once
	reportWaits    chan struct{} // the report waits for the renewal on the wire
	waitsOnce      sync.Once
}

func (r *reportRace) renewing(context.Context) {
	if !r.armed.Load() {
		return
	}
	first := false
	r.heldOnce.Do(func() { first = true; close(r.held) })
	if first {
		<-r.released
	}
}

func (r *reportRace) waits() { r.waitsOnce.Do(func() { close(r.reportWaits) }) }

// wrap is the stub's middleware: it marks the held renewal's arrival and
// holds the terminal report's answer until that renewal has been answered.
func (r *reportRace) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		terminal := r.armed.Load() && isTerminalReport(req)
		rec := &coord.StatusRecorder{ResponseWriter: w}
		h.ServeHTTP(&heldWriter{rec: rec, hold: terminal, race: r}, req)
		if strings.HasSuffix(req.URL.Path, "/lease/renew") && r.release.Load() {
			r.renewOnce.Do(func() { close(r.renewDone) })
		}
	})
}

// heldWriter passes a response through, except that the terminal report's
// is held (headers and body) until the held renewal was answered.
type heldWriter struct {
	rec  *coord.StatusRecorder
	hold bool
	race *reportRace
	once sync.Once
}

func (h *heldWriter) Header() http.Header { return h.rec.Header() }

func (h *heldWriter) WriteHeader(code int) {
	h.wait(code)
	h.rec.WriteHeader(code)
}

func (h *heldWriter) Write(b []byte) (int, error) {
	h.wait(http.StatusOK)
	return h.rec.Write(b)
}

func (h *heldWriter) wait(code int) {
	h.once.Do(func() {
		if !h.hold || code/100 != 2 {
			return
		}
		h.race.takenOnce.Do(func() { close(h.race.reportTaken) })
		<-h.race.renewDone
	})
}

// isTerminalReport: /fleet/fail, or a PATCH to a stage other than building
// (the fallback of a coordinator without /fleet/fail).
func isTerminalReport(req *http.Request) bool {
	switch {
	case req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/fleet/fail"):
		return true
	case req.Method != http.MethodPatch:
		return false
	}
	body, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(bytes.NewReader(body))
	var p PatchRequest
	return json.Unmarshal(body, &p) == nil && p.Stage != job.Building.FleetName()
}

// waitFile waits for path to exist (a script's signal), or fails the test
// when the run ended first.
func waitFile[T any](t testing.TB, path string, ended <-chan T) {
	t.Helper()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case got := <-ended:
			t.Fatalf("the run ended before %s appeared: %+v", filepath.Base(path), got)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
