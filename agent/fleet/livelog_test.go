package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// liveRig is one claimed job on a stub, its factory's client and the
// job's log file, for driving a LogStream flush by flush.
type liveRig struct {
	t      testing.TB
	s      *stub
	c      *Client
	claim  *Claim
	logs   string // the LogsDir
	path   string // the job's stdout.log
	logBuf *testenv.SyncBuffer
	fenced atomic.Value // the detail the stream fenced the run with
}

// Fence and Fenced make the rig the stream's RunLease.
func (r *liveRig) Fence(detail string) error {
	r.fenced.Store(detail)
	return nil
}

func (r *liveRig) Fenced() bool { return r.fenced.Load() != nil }

func (r *liveRig) Wire(_ context.Context, call func()) bool {
	if r.Fenced() {
		return false
	}
	call()
	return true
}

func newLiveRig(t testing.TB, s *stub, id string) *liveRig {
	t.Helper()
	r := newLiveRigOn(t, s.API, s.EnrollToken(), id)
	r.s = s
	return r
}

// newLiveRigOn is newLiveRig on a coordinator at api (another process's
// too), with its enrollment token.
func newLiveRigOn(t testing.TB, api, enrollToken, id string) *liveRig {
	t.Helper()
	text := manifestText(id, "app", "script: true")
	cat, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	j, err := manifest.Parse(id+".md", []byte(text), cat)
	if err != nil {
		t.Fatal(err)
	}
	op, err := NewClient(ClientOptions{API: api, Token: enrollToken, Budgets: fastBudgets()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Submit(context.Background(), j, []byte(text)); err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
	b := fastBudgets()
	b.LiveLog = 50 * time.Millisecond
	logBuf := &testenv.SyncBuffer{}
	c, err := NewClient(ClientOptions{API: api, Token: enrollToken, FactoryID: "f1", Budgets: b, Log: newTestLogger(logBuf)})
	if err != nil {
		t.Fatal(err)
	}
	c.SetOffer([]string{"os:linux", "engine:script", "repo:app"}, []string{"app"})
	if _, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: filepath.Join(t.TempDir(), "credentials"), EnvToken: enrollToken, Request: EnrollRequest{FactoryID: "f1"}}); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctxT(t), false)
	if err != nil || cl == nil || cl.Job.ID != id {
		t.Fatalf("claim: %+v %v", cl, err)
	}
	logs := t.TempDir()
	r := &liveRig{t: t, c: c, claim: cl, logs: logs, path: filepath.Join(logs, id, "stdout.log"), logBuf: logBuf}
	if err := os.MkdirAll(filepath.Dir(r.path), 0o700); err != nil {
		t.Fatal(err)
	}
	return r
}

// write appends to the job's log, as engines.Exec does.
func (r *liveRig) write(s string) {
	r.t.Helper()
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		r.t.Fatal(err)
	}
}

// stream is a LogStream on the job with no flush loop: the test flushes.
func (r *liveRig) stream(l *LiveLogs) *LogStream {
	l.Client, l.LogsDir = r.c, r.logs
	if l.Log == nil {
		l.Log = newTestLogger(r.logBuf)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the loop ends at once: tick and Close are the test's
	s := l.Start(ctx, r.claim, r, l.Log)
	s.wg.Wait()
	return s
}

func (r *liveRig) requests() int64 { return r.s.Stats().Count(coord.RouteLogAppend) }

func (r *liveRig) text() string {
	r.t.Helper()
	t, _ := r.s.LogText(r.claim.Job.ID, r.claim.LeaseEpoch)
	return t
}

// lines is n numbered lines of width bytes each.
func lines(from, n, width int) string {
	var b strings.Builder
	for i := from; i < from+n; i++ {
		l := fmt.Sprintf("line %06d ", i)
		b.WriteString(l + strings.Repeat("x", width-len(l)-1) + "\n")
	}
	return b.String()
}

// TestLiveLogFlushes: a flush sends what the log gained since the attempt
// began (not what earlier attempts wrote), whole lines in chunks of at
// most 64 KiB, one a flush while the stream keeps up, several only when it
// is more than half its backlog behind; nothing while the log is silent;
// a line's start waits for its end; Close sends the rest and the end; the
// coordinator's copy is the log byte for byte, any number of engine runs
// of the attempt in one stream.
func TestLiveLogFlushes(t *testing.T) {
	t.Parallel()
	r := newLiveRig(t, startStub(t, coord.Options{}), testenv.ID("live-flush"))
	r.write("=== aq job x attempt 1: script at earlier ===\nan earlier attempt\n")
	s := r.stream(&LiveLogs{Backlog: 256 << 10})
	ctx := ctxT(t)

	var want strings.Builder
	add := func(s string) { r.write(s); want.WriteString(s) }
	add("=== aq job x attempt 2: script at now ===\nfirst line\n")
	s.tick(ctx, false)
	if n := r.requests(); n != 1 || r.text() != want.String() {
		t.Fatalf("after one flush: %d requests, %q", n, r.text())
	}
	for range 3 { // silent
		s.tick(ctx, false)
	}
	if n := r.requests(); n != 1 {
		t.Fatalf("%d requests while the log was silent", n)
	}
	add("a line's start")
	s.tick(ctx, false)
	if n := r.requests(); n != 1 {
		t.Fatalf("the start of a line was sent: %d requests", n)
	}
	add(" and its end\n")
	s.tick(ctx, false)
	if n := r.requests(); n != 2 || r.text() != want.String() {
		t.Fatalf("the whole line: %d %q", r.requests(), r.text())
	}
	// A burst of 200 KiB (backlog 256 KiB): two chunks now (then 72 KiB
	// behind: under half the backlog), one a flush after.
	add(lines(0, 2000, 100))
	s.tick(ctx, false)
	if n := r.requests(); n != 4 {
		t.Fatalf("after a 200 KiB burst: %d requests, want 4", n)
	}
	s.tick(ctx, false)
	s.tick(ctx, false)
	if n := r.requests(); n != 6 || r.text() != want.String() {
		t.Fatalf("caught up: %d requests, %d of %d bytes", r.requests(), len(r.text()), want.Len())
	}
	// A second engine run in the same attempt, ending without a newline.
	add("=== aq job x attempt 2: script at later ===\nround two\nno newline at the end")
	st := s.Close(ctx, true)
	if !st.Ended || st.Gaps != 0 || st.Stopped != "" || st.Bytes != int64(want.Len()) || r.text() != want.String() {
		t.Fatalf("closed: %+v\n%q", st, r.text())
	}
	page, err := r.s.operator(t).ReadLog(ctx, r.claim.Job.ID, LogQuery{})
	if err != nil || !page.Ended || page.Attempt != r.claim.Attempt() || page.FactoryID != "f1" {
		t.Fatalf("page %+v %v", page, err)
	}
	for off := int64(0); off < page.Next; {
		p, err := r.s.operator(t).ReadLog(ctx, r.claim.Job.ID, LogQuery{Offset: off})
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range p.Records {
			if rec.Size > LogChunkMax {
				t.Fatalf("a record of %d bytes", rec.Size)
			}
		}
		off = p.Next
	}
	if got := strings.Count(r.logBuf.String(), "level=WARN"); got != 0 {
		t.Fatalf("%d warnings:\n%s", got, r.logBuf)
	}
}

// TestLiveLogOutage: while the coordinator refuses chunks (503) they wait
// in the log file, not in memory; past the backlog the oldest bytes become
// one gap record and streaming resumes at a line start; once it answers,
// the gap and the newest output arrive, and the stream's offsets still add
// up to the log. One warning for the outage, one for the gap.
func TestLiveLogOutage(t *testing.T) {
	t.Parallel()
	r := newLiveRig(t, startStub(t, coord.Options{}), testenv.ID("live-outage"))
	s := r.stream(&LiveLogs{Backlog: 128 << 10})
	ctx := ctxT(t)
	r.write("before the outage\n")
	s.tick(ctx, false)
	r.s.SetFaults(1, 0, coord.RouteLogAppend)
	all := "before the outage\n"
	for i := range 4 {
		l := lines(i*1000, 1000, 64) // 64 KB a flush
		r.write(l)
		all += l
		s.tick(ctx, false)
	}
	if got := r.text(); got != "before the outage\n" {
		t.Fatalf("taken during the outage: %d bytes", len(got))
	}
	r.s.SetFaults(0, 0)
	s.tick(ctx, false)
	st := s.Close(ctx, true)
	text := r.text()
	i := strings.Index(text, "[gap ")
	if st.Gaps != 1 || i < 0 || !st.Ended {
		t.Fatalf("no gap: %+v %q", st, text[:min(len(text), 200)])
	}
	var gap int
	fmt.Sscanf(text[i:], "[gap %d]", &gap)
	rest := text[i+len(fmt.Sprintf("[gap %d]", gap)):]
	if text[:i] != all[:i] || i+gap+len(rest) != len(all) || rest != all[i+gap:] {
		t.Fatalf("offsets do not add up: %d streamed + %d gap + %d after ≠ %d", i, gap, len(rest), len(all))
	}
	if all[i+gap-1] != '\n' || len(rest) > 128<<10 {
		t.Fatalf("streaming did not resume at a line start within the backlog: %d bytes after the gap, %q…", len(rest), rest[:min(len(rest), 40)])
	}
	logs := r.logBuf.String()
	if strings.Count(logs, "does not answer") != 1 || strings.Count(logs, "a gap is marked") != 1 || strings.Count(logs, "takes the job's output again") != 1 {
		t.Fatalf("warnings:\n%s", logs)
	}
}

// TestLiveLogCloseLetsTheChunkOnTheWireEnd: a job that ends while a chunk
// is on its way to the coordinator does not cut that request off (the
// coordinator may take it anyway, and the last flush would send it again):
// Close waits for its answer, then sends the end — two requests, the
// first never abandoned.
func TestLiveLogCloseLetsTheChunkOnTheWireEnd(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	var gated atomic.Bool
	gate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/log") && gated.CompareAndSwap(false, true) {
				close(arrived)
				<-release
			}
			next.ServeHTTP(w, r) // taken even if the client gave up, as a real server may
		})
	}
	r := newLiveRig(t, startStubBehind(t, coord.Options{}, gate), testenv.ID("live-close"))
	l := &LiveLogs{Client: r.c, LogsDir: r.logs, Every: 10 * time.Millisecond, Log: newTestLogger(r.logBuf)}
	s := l.Start(context.Background(), r.claim, r, l.Log)
	t.Cleanup(func() { s.Close(context.Background(), false) })
	r.write("the job's only line\n")
	<-arrived
	closed := make(chan LogStats, 1)
	go func() { closed <- s.Close(ctxT(t), true) }()
	// The coordinator answers once Close has had the time to cut the
	// request off (if it were to: it would then send the chunk again).
	time.Sleep(100 * time.Millisecond)
	close(release)
	st := <-closed
	if st.Requests != 2 || st.Chunks != 2 || !st.Ended || r.text() != "the job's only line\n" {
		t.Fatalf("stream %+v, text %q; want two requests: the chunk and the end", st, r.text())
	}
}

// TestLiveLogStops: a fenced run (409), a coordinator without the route and
// one that answers with garbage each stop the stream for good with one
// line, and nothing more is sent; the job is not touched.
func TestLiveLogStops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opts  coord.Options
		setup func(r *liveRig) http.Handler // a handler in front of the stub (nil: none)
		act   func(r *liveRig)
		want  string // in the stream's stop reason
		warn  string // the one warning
	}{
		{name: "fenced", act: func(r *liveRig) { r.s.Action(r.claim.Job.ID, "requeue") },
			want: "409", warn: "live log of the job stopped: the coordinator refused it (409)"},
		{name: "no route", opts: coord.Options{Routes: coord.RoutesLegacy},
			want: "has no POST /fleet/jobs/:id/log route", warn: "the coordinator has no POST /fleet/jobs/:id/log route: a running job's output is not streamed"},
		{name: "garbage", setup: func(r *liveRig) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
				if strings.HasSuffix(q.URL.Path, "/log") {
					w.Header().Set("Content-Type", "text/html")
					w.Write([]byte("<html>sign in</html>"))
					return
				}
				r.s.Server.ServeHTTP(w, q)
			})
		}, want: "is not the contract's JSON", warn: "live log of the job stopped: the coordinator's answer to POST /fleet/jobs/:id/log (200 OK, text/html) is not the contract's JSON"},
		{name: "no next", setup: func(r *liveRig) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
				if strings.HasSuffix(q.URL.Path, "/log") {
					w.Header().Set("Content-Type", "application/json")
					w.Write([]byte(`{"ok":true}`))
					return
				}
				r.s.Server.ServeHTTP(w, q)
			})
		}, want: "no next offset", warn: "live log of the job stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startStub(t, tc.opts)
			r := newLiveRig(t, s, testenv.ID("live-stop-"+strings.ReplaceAll(tc.name, " ", "-")))
			var h http.Handler = s.Server
			if tc.setup != nil {
				h = tc.setup(r)
			}
			var sent atomic.Int64 // requests of the log route, whoever answers them
			fs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
				if strings.HasSuffix(q.URL.Path, "/log") {
					sent.Add(1)
				}
				h.ServeHTTP(w, q)
			}))
			t.Cleanup(fs.Close)
			c, err := NewClient(ClientOptions{API: fs.URL + "/api", Token: r.c.token, FactoryID: "f1", Budgets: r.c.Budgets(), Log: newTestLogger(r.logBuf)})
			if err != nil {
				t.Fatal(err)
			}
			r.c = c
			if tc.act != nil {
				tc.act(r)
			}
			st := r.stream(&LiveLogs{})
			ctx := ctxT(t)
			for i := range 3 {
				r.write(fmt.Sprintf("line %d\n", i))
				st.tick(ctx, false)
			}
			stats := st.Close(ctx, true)
			if !strings.Contains(stats.Stopped, tc.want) || stats.Chunks != 0 || stats.Requests != 1 {
				t.Fatalf("stats %+v, want a stop for %q after one request", stats, tc.want)
			}
			if n := sent.Load(); n != 1 {
				t.Fatalf("%d requests", n)
			}
			logs := r.logBuf.String()
			if n := strings.Count(logs, "level=WARN"); n != 1 || !strings.Contains(logs, tc.warn) {
				t.Fatalf("%d warnings, want one with %q:\n%s", n, tc.warn, logs)
			}
			if strings.Contains(logs, r.c.token) {
				t.Fatal("the token in a log line")
			}
			// A 409 fences the run: the job stops now, not at its next renewal.
			if d, _ := r.fenced.Load().(string); (tc.name == "fenced") != strings.Contains(d, "409") {
				t.Fatalf("the run fenced with %q", d)
			}
			// A later run of the same process: a route found absent is not asked again.
			if tc.name == "no route" {
				if again := (&LiveLogs{Client: r.c, LogsDir: r.logs}).Start(ctx, r.claim, nil, nil); again != nil {
					t.Fatal("a stream started on a coordinator known to lack the route")
				}
			}
		})
	}
}

// TestLiveLogResync: a chunk whose answer was lost is sent again and taken
// once; a coordinator that lost chunks it had taken (restarted from an
// older copy) answers 416 with where its copy ends, and the factory sends
// again from there (the bytes are in its log): the coordinator's copy ends
// up the log byte for byte.
func TestLiveLogResync(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state.json")
	var resends atomic.Int64
	o := coord.Options{StateFile: state, OnCall: func(c coord.Call) {
		if c.Route == coord.RouteLogAppend && c.Resend {
			resends.Add(1)
		}
	}}
	var lose atomic.Int64 // answers of chunks to lose (the chunk is taken)
	front := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
			if strings.HasSuffix(q.URL.Path, "/log") && q.Method == http.MethodPost && lose.Add(-1) >= 0 {
				h.ServeHTTP(&discard{h: http.Header{}}, q)
				http.Error(w, "lost", http.StatusBadGateway)
				return
			}
			h.ServeHTTP(w, q)
		})
	}
	st := &stub{coordtest.StartBehind(t, o, front)}
	r := newLiveRig(t, st, testenv.ID("live-resync"))
	s := r.stream(&LiveLogs{})
	ctx := ctxT(t)
	all := ""
	for i := range 3 {
		l := fmt.Sprintf("chunk %d\n", i)
		r.write(l)
		all += l
		if i == 1 {
			lose.Store(1)
		}
		s.tick(ctx, false)
	}
	// The lost answer's chunk is re-sent within its call's budget, or, on a
	// slow machine, at the next flush: one flush more catches up either way.
	s.tick(ctx, false)
	if resends.Load() != 1 || r.text() != all {
		t.Fatalf("after a lost answer: %d resends, %q", resends.Load(), r.text())
	}
	// The coordinator restarts from a copy without the last chunk.
	st.Kill()
	run := filepath.Join(coord.LogDir(state), "logs", r.claim.Job.ID, fmt.Sprint(r.claim.LeaseEpoch)+".log")
	b, err := os.ReadFile(run)
	if err != nil {
		t.Fatal(err)
	}
	cut := bytes.LastIndex(b, []byte(`{"seq":`))
	if err := os.WriteFile(run, b[:cut], 0o600); err != nil {
		t.Fatal(err)
	}
	st.Served = coordtest.StartOn(t, st.Addr, o, front)
	if got := r.text(); got != "chunk 0\nchunk 1\n" {
		t.Fatalf("the restarted coordinator holds %q", got)
	}
	r.write("chunk 3\n")
	all += "chunk 3\n"
	s.tick(ctx, false)
	stats := s.Close(ctx, true)
	if r.text() != all || stats.Gaps != 0 || !stats.Ended {
		t.Fatalf("after the resync: %+v %q", stats, r.text())
	}
}

// discard is a ResponseWriter that throws the answer away (a lost answer).
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// TestLiveLogMasks: what the log holds is masked again on its way (a
// secret learnt after it was written), and offsets count the bytes as
// streamed.
func TestLiveLogMasks(t *testing.T) {
	t.Parallel()
	r := newLiveRig(t, startStub(t, coord.Options{}), testenv.ID("live-mask"))
	red := secrets.NewRedactor(nil)
	s := r.stream(&LiveLogs{Redactor: red})
	r.write("token=sk-live-0123456789abcdef here\n")
	red.Add("sk-live-0123456789abcdef")
	st := s.Close(ctxT(t), true)
	if got := r.text(); got != "token=*** here\n" || st.Bytes != int64(len("token=*** here\n")) {
		t.Fatalf("%q %+v", got, st)
	}
}

// TestJobStreamsItsLog: a fleet job's engine output reaches the coordinator
// while it runs (the flush loop, before the engine ends) and all of it
// before the final report; the coordinator's copy is this attempt's part
// of the job's log byte for byte, ended; the job's reports are as before.
// A coordinator without the route: one warning, the job ships, its
// artifact has the output.
func TestJobStreamsItsLog(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{}))
		w := newWorld(t, "app")
		id := testenv.ID("live-job")
		goFile := filepath.Join(w.dir, "go")
		s.submit(t, id, "app", "script: "+w.script("live", fmt.Sprintf(`echo "first line from the engine"
i=0
while [ ! -f %q ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
echo "last line"
echo done > done.txt
`, goFile))+"\nship: branch")
		f := newFactory(t, s, w, "f1", func(_ *config.Config, p *Parts) { p.LiveLogEvery = 50 * time.Millisecond })
		done := make(chan *Result, 1)
		go func() {
			res, err := f.runOnce(t, ctxT(t))
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		if !rs.legacy() {
			testenv.WaitFor(t, time.Minute, "the first line at the coordinator", func() bool {
				text, _ := s.LogText(id, 0)
				return strings.Contains(text, "first line from the engine")
			})
		}
		testenv.WriteFile(t, goFile, "")
		res := <-done
		if res == nil || res.Stage != job.Shipped {
			t.Fatalf("result %+v", res)
		}
		logFile, err := os.ReadFile(filepath.Join(f.Home, "logs", id, "stdout.log"))
		if err != nil {
			t.Fatal(err)
		}
		text, runs := s.LogText(id, 0)
		if rs.legacy() {
			if len(runs) != 0 || strings.Count(f.Logs.String(), `level=WARN msg="the coordinator has no POST /fleet/jobs/:id/log route`) != 1 {
				t.Fatalf("legacy: runs %+v\n%s", runs, f.Logs)
			}
		} else if text != string(logFile) || len(runs) != 1 || !runs[0].Ended || runs[0].LeaseEpoch != res.LeaseEpoch {
			t.Fatalf("the coordinator's live log %q (runs %+v), the log %q", text, runs, logFile)
		}
		// The job's reports are as before; no chunk was refused. (A renewal
		// refused after the terminal report is the lease keeper's race that
		// #25 fixes, not the live log's.)
		var evs []coord.Event
		for _, e := range s.Events(id) {
			if e.Kind == "fenced" && e.Call == coord.RouteRenew {
				continue
			}
			evs = append(evs, e)
		}
		if got := kinds(evs); strings.Join(got, " ") != "submitted claimed stage:building stage:shipped" {
			t.Fatalf("events %v %+v", got, evs)
		}
		if len(s.Artifacts(id)) == 0 {
			t.Fatal("no artifact")
		}
	})
}

// TestLiveLogFencesTheRun: a requeued job's factory learns of the fence
// from its next live log chunk (409), not at its next renewal (a minute
// away here): the engine is stopped, nothing is reported, and no chunk of
// the fenced run is taken after the requeue.
func TestLiveLogFencesTheRun(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	id := testenv.ID("live-fenced")
	s.submit(t, id, "app", "script: "+w.script("chatty", `i=0
while [ $i -lt 6000 ]; do echo "still working $i"; sleep 0.05; i=$((i+1)); done
`))
	f := newFactory(t, s, w, "f1", func(c *config.Config, p *Parts) {
		c.LeaseRenew = time.Minute
		p.LiveLogEvery = 50 * time.Millisecond
	})
	done := make(chan *Result, 1)
	go func() {
		res, _ := f.runOnce(t, ctxT(t))
		done <- res
	}()
	testenv.WaitFor(t, time.Minute, "the engine's output at the coordinator", func() bool {
		text, _ := s.LogText(id, 0)
		return strings.Contains(text, "still working 3")
	})
	if _, err := s.Action(id, "requeue"); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res == nil || !res.Fenced || res.Outcome.Reason != job.ReasonFenced || res.Report != "none" {
		t.Fatalf("result %+v", res)
	}
	refused := 0
	for _, e := range s.Events(id) {
		if e.Kind == "fenced" && e.Call == coord.RouteLogAppend {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d chunks refused, want the one that fenced the run: %+v", refused, s.Events(id))
	}
	if n := s.Stats().Count(coord.RouteRenew); n != 0 {
		t.Fatalf("%d renewals: the fence was not learnt from the live log", n)
	}
	if _, runs := s.LogText(id, 0); len(runs) != 1 || !runs[0].Ended {
		t.Fatalf("runs %+v", runs)
	}
}

// TestGarbageLogRouteJobGoesOn: a coordinator that answers the live log's
// route with what is not the contract's (a proxy's HTML page) stops the
// stream with one warning; the job goes on and ships, and its final
// artifact is the whole log.
func TestGarbageLogRouteJobGoesOn(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	via := &stub{coordtest.StartBehind(t, coord.Options{}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
			if strings.HasSuffix(q.URL.Path, "/log") {
				w.Header().Set("Content-Type", "text/html")
				w.Write([]byte("<html><body>Sign in to continue</body></html>"))
				return
			}
			h.ServeHTTP(w, q)
		})
	})}
	s := via
	w := newWorld(t, "app")
	id := testenv.ID("live-garbage")
	via.submit(t, id, "app", "script: "+w.script("garbled", `i=0
while [ $i -lt 40 ]; do echo "line $i of the engine"; sleep 0.02; i=$((i+1)); done
echo done > done.txt
`)+"\nship: branch")
	f := newFactory(t, via, w, "f1", func(_ *config.Config, p *Parts) { p.LiveLogEvery = 50 * time.Millisecond })
	res, err := f.runOnce(t, ctxT(t))
	if err != nil || res.Stage != job.Shipped || res.Report != "delivered" {
		t.Fatalf("result %+v %v", res, err)
	}
	if n := strings.Count(f.Logs.String(), "live log of the job stopped"); n != 1 || strings.Count(f.Logs.String(), "level=WARN") != 1 {
		t.Fatalf("%d stops said:\n%s", n, f.Logs)
	}
	want, err := os.ReadFile(filepath.Join(f.Home, "logs", id, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, a := range s.Artifacts(id) {
		if a.Name == "engine-stdout" {
			got, _ = s.ArtifactContent(a.ID)
		}
	}
	if !bytes.Equal(got, want) || !bytes.Contains(want, []byte("line 39 of the engine")) {
		t.Fatalf("the final artifact (%d bytes) is not the log (%d bytes)", len(got), len(want))
	}
}

// TestLiveLogSilentOnceFenced: a run fenced by other means (a renewal's
// 409) sends no more chunks — the engine's last lines, written as it is
// stopped, included.
func TestLiveLogSilentOnceFenced(t *testing.T) {
	t.Parallel()
	r := newLiveRig(t, startStub(t, coord.Options{}), testenv.ID("live-silent-fenced"))
	s := r.stream(&LiveLogs{})
	ctx := ctxT(t)
	r.write("before the fence\n")
	s.tick(ctx, false)
	r.Fence("a renewal was refused (409)")
	r.write("Terminated\n")
	s.tick(ctx, false)
	st := s.Close(ctx, true)
	if n := r.requests(); n != 1 || st.Stopped == "" || r.text() != "before the fence\n" {
		t.Fatalf("%d requests, %+v, %q", n, st, r.text())
	}
}

// TestLiveLogAndRenewalTakeTurns: a live log chunk and a lease renewal are
// never on the wire together, so a fenced factory sends nothing after the
// first 409: here the chunk is on the wire (the coordinator holds its
// answer) when the job is requeued and a renewal comes due; the renewal
// waits, the chunk is refused 409 and fences the run, and the renewal is
// never sent.
func TestLiveLogAndRenewalTakeTurns(t *testing.T) {
	t.Parallel()
	onWire, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := &stub{coordtest.StartBehind(t, coord.Options{}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
			if q.Method == http.MethodPost && strings.HasSuffix(q.URL.Path, "/log") {
				once.Do(func() { close(onWire) })
				<-release
			}
			h.ServeHTTP(w, q)
		})
	})}
	r := newLiveRig(t, s, testenv.ID("live-turns"))
	ctx := ctxT(t)
	jobCtx, stopJob := context.WithCancelCause(ctx)
	defer stopJob(nil)
	lease := NewJobLease(r.c, r.claim, 20*time.Millisecond, stopJob, nil, newTestLogger(r.logBuf))
	waited := make(chan struct{}, 1)
	lease.Hooks = &LeaseHooks{RenewalWaits: func() {
		select {
		case waited <- struct{}{}:
		default:
		}
	}}
	stream := (&LiveLogs{Client: r.c, LogsDir: r.logs}).Start(ctx, r.claim, lease, newTestLogger(r.logBuf))
	r.write("a line\n")
	<-onWire
	if _, err := s.Action(r.claim.Job.ID, "requeue"); err != nil {
		t.Fatal(err)
	}
	lease.Start(context.WithoutCancel(jobCtx))
	<-waited // a renewal came due while the chunk was on the wire
	close(release)
	testenv.WaitFor(t, time.Minute, "the run fenced", lease.Fenced)
	st := stream.Close(ctx, false)
	lease.End()
	if n := s.Stats().Count(coord.RouteRenew); n != 0 {
		t.Fatalf("%d renewals sent after the chunk's 409", n)
	}
	fenced := 0
	for _, e := range s.Events(r.claim.Job.ID) {
		if e.Kind == "fenced" {
			fenced++
		}
	}
	if fenced != 1 || !strings.Contains(st.Stopped, "409") {
		t.Fatalf("%d refusals, stream %+v", fenced, st)
	}
}

// TestLiveLogCarriesRepairRounds: an attempt that runs the engine again in
// repair rounds is one stream: the first run's output, then each round's
// behind its "repair N/M" header, the coordinator's copy the attempt's log
// byte for byte.
func TestLiveLogCarriesRepairRounds(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	id := testenv.ID("live-rounds")
	s.submit(t, id, "app", "script: "+answerScript(w, id)+"; echo \"the engine wrote $(cat answer.txt)\"\n"+answerVerify+"\nverify_rounds: 2\nship: branch")
	f := newFactory(t, s, w, "f1")
	res, err := f.runOnce(t, ctxT(t))
	if err != nil || res.Stage != job.Shipped {
		t.Fatalf("result %+v %v", res, err)
	}
	want, err := os.ReadFile(filepath.Join(f.Home, "logs", id, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	text, runs := s.LogText(id, 0)
	if text != string(want) || len(runs) != 1 || !runs[0].Ended {
		t.Fatalf("the live log %q (runs %+v) is not the attempt's log %q", text, runs, want)
	}
	i1, i2, i3 := strings.Index(text, "the engine wrote 41"), strings.Index(text, "repair 1/2"), strings.Index(text, "the engine wrote 42")
	if i1 < 0 || i2 < i1 || i3 < i2 {
		t.Fatalf("not the first run, then the round:\n%s", text)
	}
}
