package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

// TestJudgeBody: what a 404/405's body alone says, for the answers real
// servers give.
func TestJudgeBody(t *testing.T) {
	t.Parallel()
	express := "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Error</title>\n</head>\n<body>\n<pre>Cannot POST /api/fleet/fail</pre>\n</body>\n</html>\n"
	for _, tc := range []struct {
		name         string
		status       int
		body         string
		method, path string
		want         missing
	}{
		{"express unknown route", 404, express, "POST", "/api/fleet/fail", missingRoute},
		{"express json-ish unknown route", 404, `{"error":"Cannot POST /fleet/factories/f1/deregister"}`, "POST", "/fleet/factories/f1/deregister", missingRoute},
		{"nestjs", 404, `{"statusCode":404,"message":"Cannot PATCH /api/fleet/jobs/j1","error":"Not Found"}`, "PATCH", "/api/fleet/jobs/j1", missingRoute},
		{"fastify", 404, `{"message":"Route POST:/api/fleet/accept not found","error":"Not Found","statusCode":404}`, "POST", "/api/fleet/accept", missingRoute},
		{"go mux", 404, "404 page not found\n", "POST", "/fleet/fail", missingRoute},
		{"go mux 405", 405, "Method Not Allowed\n", "POST", "/fleet/fail", missingRoute},
		{"any 405", 405, `{"error":"nope"}`, "POST", "/fleet/fail", missingRoute},
		{"stub: no such job", 404, `{"error":"no job j1"}`, "PATCH", "/api/fleet/jobs/j1", missingResource},
		{"a handler's words, not the route", 404, `{"error":"cannot PATCH /api/fleet/jobs/j1: no such job"}`, "PATCH", "/api/fleet/jobs/j1", missingResource},
		{"another request's path", 404, `Cannot POST /api/fleet/failures`, "POST", "/api/fleet/fail", missingUnsure},
		{"another method", 404, `Cannot GET /api/fleet/fail`, "POST", "/api/fleet/fail", missingUnsure},
		{"json without error field", 404, `{"leaseExpiresAt":"2030-01-01T00:00:00Z"}`, "POST", "/api/fleet/jobs/j1/lease/renew", missingResource},
		{"empty", 404, "", "POST", "/api/fleet/fail", missingUnsure},
		{"proxy page", 404, "<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>", "POST", "/api/fleet/fail", missingUnsure},
		{"plain text", 404, "job not found", "POST", "/api/fleet/fail", missingUnsure},
	} {
		if got := judgeBody(tc.status, []byte(tc.body), tc.method, tc.path); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// ambiguous is a coordinator that answers every 404 with an empty body (a
// proxy's, or a framework's without a page), so only a probe can tell a
// route it lacks from a job it lacks. It has GET /fleet/jobs/:id for the
// jobs in jobs, PATCH for them, and no /fleet/fail; unknown paths answer
// the same empty 404.
type ambiguous struct {
	mu    sync.Mutex
	jobs  map[string]bool
	calls []string
}

func (a *ambiguous) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.calls = append(a.calls, r.Method+" "+r.URL.Path)
	a.mu.Unlock()
	p := strings.TrimPrefix(r.URL.Path, "/api")
	if id, ok := strings.CutPrefix(p, "/fleet/jobs/"); ok && !strings.Contains(id, "/") && (r.Method == "GET" || r.Method == "PATCH") {
		if !a.jobs[id] {
			w.WriteHeader(404)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"` + id + `","stage":"failed"}`))
		return
	}
	if p == "/fleet/queue-state" {
		w.WriteHeader(404) // a route that answers 404 with no body for a reason of its own
		_, _ = w.Write([]byte("no queue state for this product"))
		return
	}
	w.WriteHeader(404)
}

func (a *ambiguous) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string{}, a.calls...)
}

// TestProbeDecidesAnAmbiguous404: an empty 404 on /fleet/fail for a job the
// coordinator has (GET /fleet/jobs/:id answers 200) is the route's absence
// — learnt, the fallback PATCH goes out — while one for a job it does not
// have is the job's; a route-level 404 that differs from an unknown path's
// is the route's own answer, not its absence.
func TestProbeDecidesAnAmbiguous404(t *testing.T) {
	t.Parallel()
	a := &ambiguous{jobs: map[string]bool{"here": true}}
	srv := httptest.NewServer(a)
	defer srv.Close()
	c := testClient(t, srv.URL, fastBudgets())

	_, err := c.Fail(context.Background(), FailRequest{JobID: "gone", LeaseEpoch: 1, Reason: job.ReasonEngineFailed}, false)
	if !errors.Is(err, ErrGone) || !c.Has(RouteFail) {
		t.Fatalf("a job the coordinator lacks: %v, has fail %t", err, c.Has(RouteFail))
	}
	stage, err := c.Fail(context.Background(), FailRequest{JobID: "here", LeaseEpoch: 1, Reason: job.ReasonEngineFailed}, false)
	if err != nil || stage != "failed" || c.Has(RouteFail) {
		t.Fatalf("a job it has: %q %v, has fail %t", stage, err, c.Has(RouteFail))
	}
	calls := a.seen()
	if want := []string{"POST /api/fleet/fail", "GET /api/fleet/jobs/gone", "POST /api/fleet/fail", "GET /api/fleet/jobs/here", "PATCH /api/fleet/jobs/here", "POST /api/fleet/jobs/here/lease/release"}; !reflect.DeepEqual(calls[:len(want)], want) {
		t.Fatalf("calls %v", calls)
	}
	// queue-state answers a 404 of its own (text an unknown path does not
	// give): present.
	_, err = c.QueueState(context.Background())
	if IsRouteAbsent(err) || !c.Has(RouteQueueState) {
		t.Fatalf("queue-state: %v", err)
	}
	// accept answers exactly like an unknown path: absent.
	if ok, err := c.Probe(context.Background(), RouteAccept); ok || err != nil || c.Has(RouteAccept) {
		t.Fatalf("accept probe: %t %v", ok, err)
	}
}

// TestRouteAbsenceIsRemembered: an optional route found absent is not
// asked again (the caller's fallback runs at once); a core route's absence
// is an error each time, never remembered (a misrouted proxy must not stop
// a factory for good), and says to check AQ_FLEET_API.
func TestRouteAbsenceIsRemembered(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	hits := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.Method+" "+r.URL.Path]++
		mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(404)
		_, _ = w.Write([]byte("<pre>Cannot " + r.Method + " " + r.URL.Path + "</pre>"))
	}))
	defer srv.Close()
	c := testClient(t, srv.URL, fastBudgets())
	for range 3 {
		if _, err := c.QueueState(context.Background()); !IsRouteAbsent(err) {
			t.Fatalf("queue-state: %v", err)
		}
		_, err := c.Claim(context.Background(), false)
		var ra *RouteAbsentError
		if !errors.As(err, &ra) || ra.Optional() || !strings.Contains(err.Error(), "AQ_FLEET_API") {
			t.Fatalf("claim: %v", err)
		}
	}
	if ok, _ := c.Probe(context.Background(), RouteQueueState); ok {
		t.Fatal("probe of a known-absent route")
	}
	mu.Lock()
	defer mu.Unlock()
	if hits["GET /api/fleet/queue-state"] != 1 || hits["POST /api/fleet/claim"] != 3 {
		t.Fatalf("hits %v", hits)
	}
	if got := c.AbsentRoutes(); !reflect.DeepEqual(got, []string{RouteQueueState, RouteClaim}) {
		t.Fatalf("absent %v", got)
	}
}

// TestFailPatchCarriesEveryFailField: every field of FailRequest is either
// carried by the fallback PATCH (same JSON name, same value) or listed in
// failOnly with a reason. A field added to FailRequest fails this test
// until it is one line in failPatch (and PatchRequest) or one in failOnly.
func TestFailPatchCarriesEveryFailField(t *testing.T) {
	t.Parallel()
	var f FailRequest
	fill(reflect.ValueOf(&f).Elem())
	p := failPatch(f, "queued")
	fm, pm := asMap(t, f), asMap(t, p)
	ft := reflect.TypeOf(f)
	for i := range ft.NumField() {
		name, _, _ := strings.Cut(ft.Field(i).Tag.Get("json"), ",")
		if _, ok := failOnly[name]; ok {
			continue
		}
		if !reflect.DeepEqual(fm[name], pm[name]) {
			t.Errorf("FailRequest.%s (%q) is not carried by the fallback PATCH: add it to PatchRequest and failPatch (one line), or to failOnly with why (PATCH has %v)",
				ft.Field(i).Name, name, pm[name])
		}
	}
	if pm["stage"] != "queued" || pm["leaseEpoch"] == nil {
		t.Fatalf("patch %v", pm)
	}
}

func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// fill sets every settable field of v to a non-zero value.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x-" + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Type() == reflect.TypeOf(time.Duration(0)) {
			v.SetInt(int64(time.Minute))
			return
		}
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		n := reflect.New(v.Type().Elem())
		fill(n.Elem())
		v.Set(n)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	}
}

// TestFailStage: the fallback PATCH's stage.
func TestFailStage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f         FailRequest
		exhausted bool
		want      string
	}{
		{FailRequest{Reason: job.ReasonEngineFailed, Retryable: true}, false, "queued"},
		{FailRequest{Reason: job.ReasonEngineFailed, Retryable: true}, true, "failed"},
		{FailRequest{Reason: job.ReasonEngineFailed, Retryable: false}, false, "failed"},
		{FailRequest{Reason: job.ReasonInvalidManifest, Retryable: true}, false, "failed"},
		{FailRequest{Reason: job.ReasonCrash, Retryable: true}, false, "queued"},
	} {
		if got := FailStage(tc.f, tc.exhausted); got != tc.want {
			t.Errorf("%+v exhausted=%t: %s, want %s", tc.f, tc.exhausted, got, tc.want)
		}
	}
}
