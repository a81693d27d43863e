package coord

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// chunk is a live log chunk's body as a factory sends it.
func chunk(epoch, seq, offset int64, text string) map[string]any {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(text))
	zw.Close()
	return map[string]any{"attempt": 1, "leaseEpoch": epoch, "seq": seq, "offset": offset, "kind": "output", "size": len(text),
		"encoding": "gzip", "data": base64.StdEncoding.EncodeToString(buf.Bytes())}
}

func gapChunk(epoch, seq, offset, size int64) map[string]any {
	return map[string]any{"attempt": 1, "leaseEpoch": epoch, "seq": seq, "offset": offset, "kind": "gap", "size": size}
}

// running is a rig with job id claimed by factory f1 (building); it
// returns f1's token and the lease epoch.
func (r *rig) running(id string) (string, int64) {
	r.t.Helper()
	tok := r.enroll("f1", "os:linux", "engine:script")
	r.submit(id, nil)
	code, m := r.claim("f1", tok)
	if code != 200 {
		r.t.Fatalf("claim: %d %v", code, m)
	}
	return tok, epochOf(m)
}

func (r *rig) logPath(id string) string { return "/fleet/jobs/" + id + "/log" }

// TestLiveLogAppendRead: chunks are appended where the run's stream ends
// and read back from any offset; a re-sent chunk is a no-op 200; an offset
// that does not follow is 416 with where the stream ends; a gap is a
// record of its own; the end marks the run ended; a stale epoch or another
// factory is refused 409 (and audited as fenced); bad chunks are refused.
func TestLiveLogAppendRead(t *testing.T) {
	r := newRig(t, Options{})
	tok, e := r.running("j1")
	op := r.s.EnrollToken()
	path := r.logPath("j1")

	for _, tc := range []struct {
		name string
		body map[string]any
		want int
		next float64
	}{
		{"first", chunk(e, 1, 0, "hello\n"), 200, 6},
		{"second", chunk(e, 2, 6, "world\n"), 200, 12},
		{"re-sent", chunk(e, 2, 6, "world\n"), 200, 12},
		{"offset behind", chunk(e, 3, 6, "again\n"), 416, 12},
		{"offset ahead", chunk(e, 3, 20, "later\n"), 416, 12},
		{"gap", gapChunk(e, 3, 12, 100), 200, 112},
		{"after the gap", chunk(e, 4, 112, "back\n"), 200, 117},
	} {
		code, m := r.call("POST", path, tok, tc.body)
		if code != tc.want || m["next"] != tc.next {
			t.Fatalf("%s: %d %v, want %d next %v", tc.name, code, m, tc.want, tc.next)
		}
		if tc.name == "re-sent" && m["duplicate"] != true {
			t.Fatalf("re-sent: %v", m)
		}
	}
	code, m := r.call("GET", path+"?offset=0", op, nil)
	recs, _ := m["records"].([]any)
	if code != 200 || len(recs) != 4 || m["next"] != float64(117) || m["ended"] != false || m["leaseEpoch"] != float64(e) {
		t.Fatalf("read: %d %v", code, m)
	}
	if text, _ := r.s.LogText("j1", 0); text != "hello\nworld\n[gap 100]back\n" {
		t.Fatalf("text %q", text)
	}
	// From inside a record: the record is cut there.
	code, m = r.call("GET", path+"?offset=8", op, nil)
	recs, _ = m["records"].([]any)
	if first := recs[0].(map[string]any); code != 200 || first["offset"] != float64(8) || first["text"] != "rld\n" || first["size"] != float64(4) {
		t.Fatalf("read from 8: %d %v", code, m)
	}

	// Refused: a chunk of another factory, bad chunks, an unknown job.
	tok2 := r.enroll("f2", "os:linux")
	bad := func(mod func(m map[string]any)) map[string]any {
		c := chunk(e, 9, 117, "x\n")
		mod(c)
		return c
	}
	for _, tc := range []struct {
		name, path, token string
		body              map[string]any
		want              int
	}{
		{"another factory", path, tok2, chunk(e, 5, 117, "x\n"), 409},
		{"no such job", r.logPath("nope"), tok, chunk(e, 5, 0, "x\n"), 404},
		{"operator token", path, op, chunk(e, 5, 117, "x\n"), 403},
		{"kind", path, tok, bad(func(m map[string]any) { m["kind"] = "text" }), 400},
		{"seq", path, tok, bad(func(m map[string]any) { m["seq"] = 0 }), 400},
		{"base64", path, tok, bad(func(m map[string]any) { m["data"] = "!!" }), 400},
		{"gzip", path, tok, bad(func(m map[string]any) { m["data"] = base64.StdEncoding.EncodeToString([]byte("plain")) }), 400},
		{"size", path, tok, bad(func(m map[string]any) { m["size"] = 5 }), 400},
		{"too big", path, tok, chunk(e, 9, 117, strings.Repeat("x", MaxLogChunk+1)), 413},
		{"gap with data", path, tok, bad(func(m map[string]any) { m["kind"] = "gap" }), 400},
	} {
		if code, m := r.call("POST", tc.path, tc.token, tc.body); code != tc.want {
			t.Errorf("%s: %d %v, want %d", tc.name, code, m, tc.want)
		}
	}

	// The end: the run is ended; a requeue later fences the holder's chunks.
	if code, m := r.call("POST", path, tok, map[string]any{"attempt": 1, "leaseEpoch": e, "seq": 5, "offset": 117, "kind": "output", "size": 0, "end": true}); code != 200 || m["next"] != float64(117) {
		t.Fatalf("end: %d %v", code, m)
	}
	if _, m := r.call("GET", path+"?offset=117&wait=10", op, nil); m["ended"] != true {
		t.Fatalf("ended: %v", m)
	}
	if _, err := r.s.Action("j1", "requeue"); err != nil {
		t.Fatal(err)
	}
	if code, m := r.call("POST", path, tok, chunk(e, 6, 117, "zombie\n")); code != 409 || !strings.Contains(m["error"].(string), "nobody holds its lease") {
		t.Fatalf("a fenced run's chunk: %d %v", code, m)
	}
	evs := r.s.Events("j1")
	if last := evs[len(evs)-1]; last.Kind != "fenced" || last.Call != RouteLogAppend || last.Epoch != e {
		t.Fatalf("audit %+v", last)
	}
	// The next run (epoch bumped) streams from 0 again; the first is kept.
	code, m = r.claim("f1", tok)
	e2 := epochOf(m)
	if code != 200 || e2 <= e {
		t.Fatalf("claim again: %d %v", code, m)
	}
	if code, m := r.call("POST", path, tok, chunk(e, 7, 117, "stale\n")); code != 409 || !strings.Contains(m["error"].(string), "stale lease epoch") {
		t.Fatalf("stale epoch: %d %v", code, m)
	}
	if code, m := r.call("POST", path, tok, chunk(e2, 1, 3, "x\n")); code != 416 || m["next"] != float64(0) {
		t.Fatalf("a new run not from 0: %d %v", code, m)
	}
	if code, _ := r.call("POST", path, tok, chunk(e2, 1, 0, "second run\n")); code != 200 {
		t.Fatal(code)
	}
	_, m = r.call("GET", path, op, nil)
	runs, _ := m["runs"].([]any)
	if m["leaseEpoch"] != float64(e2) || len(runs) != 2 || runs[0].(map[string]any)["ended"] != true || runs[1].(map[string]any)["ended"] != false {
		t.Fatalf("runs: %v", m)
	}
	if code, m := r.call("GET", path+"?offset=x", op, nil); code != 400 {
		t.Fatalf("bad offset: %d %v", code, m)
	}
}

// TestLiveLogLongPoll: a read with wait= is answered when a chunk comes
// (not when the wait is over), when the run ends with the job's lease, and
// at once when there is something to read.
func TestLiveLogLongPoll(t *testing.T) {
	r := newRig(t, Options{})
	tok, e := r.running("j1")
	op := r.s.EnrollToken()
	path := r.logPath("j1")
	type answer struct {
		code int
		m    map[string]any
	}
	read := func(q string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			code, m := r.call("GET", path+q, op, nil)
			ch <- answer{code, m}
		}()
		return ch
	}
	// No run yet: the poll waits for the first chunk.
	first := read("?wait=30")
	waitPolling(t, r.s, 1)
	if code, _ := r.call("POST", path, tok, chunk(e, 1, 0, "line one\n")); code != 200 {
		t.Fatal(code)
	}
	a := <-first
	if recs, _ := a.m["records"].([]any); a.code != 200 || len(recs) != 1 || recs[0].(map[string]any)["text"] != "line one\n" {
		t.Fatalf("first: %+v", a)
	}
	// Caught up: the poll waits for the next chunk.
	next := read(fmt.Sprintf("?epoch=%d&offset=9&wait=30", e))
	waitPolling(t, r.s, 2)
	r.call("POST", path, tok, chunk(e, 2, 9, "line two\n"))
	if a := <-next; a.m["next"] != float64(18) {
		t.Fatalf("next: %+v", a)
	}
	// Caught up again: the job's end (its lease over) answers the poll.
	end := read(fmt.Sprintf("?epoch=%d&offset=18&wait=30", e))
	waitPolling(t, r.s, 3)
	if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "shipped", "leaseEpoch": e}); code != 200 {
		t.Fatal(code)
	}
	if a := <-end; a.m["ended"] != true || len(a.m["records"].([]any)) != 0 {
		t.Fatalf("end: %+v", a)
	}
}

// waitPolling waits until n reads of the live log have begun to wait at
// the stub (so a test's chunk comes after the poll began).
func waitPolling(t *testing.T, s *Server, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a deadlock guard, not a speed limit
	for s.logs.polls.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads of the live log never arrived", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLiveLogAndArtifactsSurviveRestart: with a state file, chunks and
// artifacts are on disk beside it: a second stub on the same file has
// every one it acknowledged; a record torn by a crash (no answer sent) is
// dropped and the writer resumes where the kept stream ends.
func TestLiveLogAndArtifactsSurviveRestart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	r := newRig(t, Options{StateFile: file})
	tok, e := r.running("j1")
	path := r.logPath("j1")
	for i, l := range []string{"one\n", "two\n", "three\n"} {
		off := []int64{0, 4, 8}[i]
		if code, m := r.call("POST", path, tok, chunk(e, int64(i+1), off, l)); code != 200 {
			t.Fatal(code, m)
		}
	}
	r.call("POST", path, tok, gapChunk(e, 4, 14, 50))
	if code, m := r.call("POST", "/fleet/jobs/j1/artifacts", tok, upload("the whole log\n", e)); code != 201 {
		t.Fatal(code, m)
	}
	// A torn write: a record's line without its bytes.
	run := filepath.Join(LogDir(file), "logs", "j1", fmt.Sprint(e)+".log")
	f, err := os.OpenFile(run, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"seq":5,"offset":64,"kind":"output","size":100}` + "\nhalf")
	f.Close()

	r2 := newRig(t, Options{StateFile: file})
	text, runs := r2.s.LogText("j1", 0)
	if text != "one\ntwo\nthree\n[gap 50]" || len(runs) != 1 || runs[0].Size != 64 || runs[0].FactoryID != "f1" {
		t.Fatalf("after restart: %q %+v", text, runs)
	}
	arts := r2.s.Artifacts("j1")
	if len(arts) != 1 {
		t.Fatalf("artifacts after restart: %+v", arts)
	}
	if b, ok := r2.s.ArtifactContent(arts[0].ID); !ok || string(b) != "the whole log\n" {
		t.Fatalf("artifact bytes: %q %v", b, ok)
	}
	// The writer goes on: its torn chunk is asked again at 64.
	if code, m := r2.call("POST", path, tok, chunk(e, 6, 70, "x\n")); code != 416 || m["next"] != float64(64) {
		t.Fatalf("after the torn record: %d %v", code, m)
	}
	if code, _ := r2.call("POST", path, tok, chunk(e, 5, 64, "four\n")); code != 200 {
		t.Fatal(code)
	}
	if code, m := r2.call("POST", "/fleet/jobs/j1/artifacts", tok, upload("a second\n", e)); code != 201 || m["id"] == arts[0].ID {
		t.Fatalf("a new artifact's id after restart: %d %v", code, m)
	}
	r3 := newRig(t, Options{StateFile: file})
	if text, _ := r3.s.LogText("j1", 0); text != "one\ntwo\nthree\n[gap 50]four\n" {
		t.Fatalf("third start: %q", text)
	}
	if n := len(r3.s.Artifacts("j1")); n != 2 {
		t.Fatalf("%d artifacts", n)
	}
}

// TestLiveLogBounds: a job over its cap loses its older runs first, and a
// run that would pass the cap alone is refused 413; over the total, the
// oldest jobs lose their logs first — on disk too.
func TestLiveLogBounds(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	r := newRig(t, Options{StateFile: file, LogJobCap: 100, LogCap: 250})
	tok := r.enroll("f1", "os:linux", "engine:script")
	line := strings.Repeat("x", 59) + "\n" // 60 bytes
	for _, id := range []string{"old", "mid", "new"} {
		r.submit(id, nil)
		r.clk.Add(time.Minute)
	}
	claim := func(want string) int64 {
		code, m := r.claim("f1", tok)
		if code != 200 || m["job"].(map[string]any)["id"] != want {
			t.Fatalf("claim: %d %v", code, m)
		}
		return epochOf(m)
	}
	for _, id := range []string{"old", "mid"} {
		e := claim(id)
		if code, m := r.call("POST", r.logPath(id), tok, chunk(e, 1, 0, line)); code != 200 {
			t.Fatal(code, m)
		}
		r.call("PATCH", "/fleet/jobs/"+id, tok, map[string]any{"stage": "shipped", "leaseEpoch": e})
	}
	e := claim("new")
	p := r.logPath("new")
	r.call("POST", p, tok, chunk(e, 1, 0, line))
	// 180 bytes kept in all; the new job's second chunk would make its run
	// 120: over the job's cap.
	if code, m := r.call("POST", p, tok, chunk(e, 2, 60, line)); code != 413 {
		t.Fatalf("over the job's cap: %d %v", code, m)
	}
	// Its next run: the first run goes to make room.
	r.s.Action("new", "requeue")
	e2 := claim("new")
	r.call("POST", p, tok, chunk(e2, 1, 0, line))
	r.call("POST", p, tok, gapChunk(e2, 2, 60, 10))
	if code, _ := r.call("POST", p, tok, chunk(e2, 3, 70, "y\n")); code != 200 {
		t.Fatal(code)
	}
	if _, runs := r.s.LogText("new", 0); len(runs) != 1 || runs[0].LeaseEpoch != e2 || runs[0].Size != 72 {
		t.Fatalf("the older run kept: %+v", runs)
	}
	if _, err := os.Stat(filepath.Join(LogDir(file), "logs", "new", fmt.Sprint(e)+".log")); !os.IsNotExist(err) {
		t.Fatalf("the older run is still on disk: %v", err)
	}
	// Over the total (250): the oldest job's log goes, on disk too.
	if _, runs := r.s.LogText("old", 0); len(runs) != 1 {
		t.Fatalf("old pruned too soon: %+v", runs)
	}
	tok2 := r.enroll("f2", "os:linux", "engine:script")
	r.submit("newest", nil)
	code, m := r.claim("f2", tok2)
	if code != 200 || m["job"].(map[string]any)["id"] != "newest" {
		t.Fatalf("claim newest: %d %v", code, m)
	}
	r.call("POST", r.logPath("newest"), tok2, chunk(epochOf(m), 1, 0, line))
	r.call("POST", r.logPath("newest"), tok2, chunk(epochOf(m), 2, 60, line[:30]))
	if _, runs := r.s.LogText("old", 0); len(runs) != 0 {
		t.Fatalf("the oldest job's log is kept over the total: %+v", runs)
	}
	if _, err := os.Stat(filepath.Join(LogDir(file), "logs", "old")); !os.IsNotExist(err) {
		t.Fatalf("the oldest job's log is still on disk: %v", err)
	}
	for _, id := range []string{"mid", "new", "newest"} {
		if _, runs := r.s.LogText(id, 0); len(runs) == 0 {
			t.Fatalf("%s lost its log", id)
		}
	}
}

// TestLiveLogLegacyRoutes: the coordinator in service today has no live
// log: both routes answer as it answers an unknown route.
func TestLiveLogLegacyRoutes(t *testing.T) {
	r := newRig(t, Options{Routes: RoutesLegacy})
	tok, e := r.running("j1")
	for _, tc := range []struct{ method, token string }{{"POST", tok}, {"GET", r.s.EnrollToken()}} {
		req, _ := http.NewRequest(tc.method, r.url+"/api"+r.logPath("j1"), bytes.NewReader([]byte(`{}`)))
		req.Header.Set("Authorization", "Bearer "+tc.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.Contains(b.String(), "Cannot "+tc.method+" /api/fleet/jobs/j1/log") {
			t.Fatalf("%s: %d %s", tc.method, resp.StatusCode, b.String())
		}
	}
	_ = e
	if !slices.Contains(ProposedRoutes, RouteLogAppend) || r.s.Serves(RouteLogRead) {
		t.Fatal("the live log routes are in the legacy set")
	}
}

// TestRemovedJobTakesItsLogs: a job removed (DELETE /fleet/jobs/:id) takes
// its live log and artifacts with it, from disk too: a restarted stub does
// not bring them back, and the id submitted again starts with none.
func TestRemovedJobTakesItsLogs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	r := newRig(t, Options{StateFile: file})
	tok, e := r.running("j1")
	r.call("POST", r.logPath("j1"), tok, chunk(e, 1, 0, "output of the run\n"))
	r.call("POST", "/fleet/jobs/j1/artifacts", tok, upload("the whole log\n", e))
	r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "shipped", "leaseEpoch": e})
	r.s.Action("j1", "reject")
	if code, m := r.call("DELETE", "/fleet/jobs/j1", r.s.EnrollToken(), nil); code != 200 {
		t.Fatalf("remove: %d %v", code, m)
	}
	for i, s := range []*Server{r.s, newRig(t, Options{StateFile: file}).s} {
		if _, runs := s.LogText("j1", 0); len(runs) != 0 || len(s.Artifacts("j1")) != 0 {
			t.Fatalf("stub %d: the removed job's live log (%d runs) or artifacts (%d) are back", i, len(runs), len(s.Artifacts("j1")))
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(LogDir(file), "artifacts")); len(ents) != 0 {
		t.Fatalf("files left: %v", ents)
	}
}
