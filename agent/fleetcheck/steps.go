package fleetcheck

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/job"
)

// The check's steps, in the order they run (the table's order is the
// contract's): enroll; the request rules; heartbeat; submit job A and read
// it; claim A and report on it (building, its re-send, two checkpoints),
// renew, release; lease A again (accept, else claim) and check the
// checkpoint it carries, a stale epoch's writes, a terminal report and its
// re-send, the lease after it; A's artifacts, events and an operator
// action; submit job B, lease it, park it (/fleet/fail with notBefore) and
// see it held, then handed out; end B; deregister.

// offer is what the check's factory offers: the script engine, its own
// repository and a tool no factory has, so it fits its own jobs and no
// real job needs more than it offers but for a rare job that needs nothing.
func (c *checker) offer() (caps, repos []string) {
	return []string{"engine:script", "has:" + c.name, "repo:" + c.name}, []string{c.name}
}

// manifestText is one of the check's jobs: it needs has:<name>, which no
// factory but the check's offers; note ends its body (a replacement's
// differs).
func (c *checker) manifestText(id, note string) string {
	return fmt.Sprintf(`---
id: %s
repo: %s
product: %s
engine: script
script: "true"
ship: none
capabilities: [has:%s]
idempotencyKey: %s
---
# aq fleet check: a conformance test job

Submitted by aq fleet check to hold this coordinator to aq's fleet contract
(docs/contract.md). It needs has:%s, which no factory offers, so no factory
takes it: the check leases it itself, runs nothing, and ends it.%s
`, id, c.name, c.o.Product, c.name, id, c.name, note)
}

// enroll trades the enrollment token for the check factory's token. A URL
// where nothing answers, or what answers does not enroll, is a
// *NotCoordinatorError; a refused token the *fleet.AuthError.
func (c *checker) enroll(ctx context.Context) error {
	// One plain request first: a host that does not answer at all is said
	// at once, not after the enroll call's retries.
	ex, err := c.fac.Exchange(ctx, http.MethodGet, "/fleet/queue-state", nil)
	if err != nil {
		return &NotCoordinatorError{API: c.fac.API(), Why: "no answer: " + err.Error()}
	}
	c.noteDate(ex)
	caps, repos := c.offer()
	en, err := c.fac.Enroll(ctx, fleet.EnrollRequest{FactoryID: c.factory, Hostname: c.factory, Capabilities: caps, Repos: repos,
		Engines: []string{"script"}, SeatLimit: 1, Version: c.o.Version})
	var se *fleet.StatusError
	switch {
	case err == nil:
	case fleet.IsAuth(err):
		return err
	case fleet.IsRouteAbsent(err):
		return &NotCoordinatorError{API: c.fac.API(), Why: "it has no " + fleet.RouteEnroll + " route (" + evidence(err) + ")"}
	case errors.As(err, &se), fleet.IsContract(err):
		// A refusal, or an answer that is not the contract's JSON (a web
		// server's page): not a coordinator.
		return &NotCoordinatorError{API: c.fac.API(), Why: fleet.RouteEnroll + " " + answer(err)}
	default:
		return err
	}
	c.present(fleet.RouteEnroll)
	if en.FactoryID != c.factory {
		// The coordinator named the factory: its jobs, repository and
		// capability keep the check's own name.
		c.factory = en.FactoryID
		c.rep.FactoryID = en.FactoryID
	}
	c.fac.SetToken(en.Token)
	c.fac.SetFactoryID(en.FactoryID)
	c.fac.SetOffer(caps, repos)
	return nil
}

// noteDate learns the coordinator's clock from an answer's Date header.
func (c *checker) noteDate(ex *fleet.Exchange) {
	d, err := http.ParseTime(ex.Header.Get("Date"))
	if err != nil {
		return
	}
	if skew := time.Until(d); skew > 2*time.Second || skew < -2*time.Second {
		c.skew = skew.Round(time.Second)
	}
}

func (c *checker) steps(ctx context.Context) error {
	for _, step := range []func(context.Context) error{
		c.requestRules, c.heartbeat, c.submitA, c.leaseA, c.finishA, c.operatorReads, c.parkB, c.beyond,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// beyond says what the check does not reach over REST.
func (c *checker) beyond(context.Context) error {
	c.unchecked(RuleBroker, "the check speaks REST only; a factory's dispatch metrics and aq servicebus ensure-subscription show the broker's side")
	return nil
}

// requestRules: an unknown route, an unknown job, the Date header.
func (c *checker) requestRules(ctx context.Context) error {
	ex, err := c.exchange(ctx, c.fac, http.MethodPost, "/fleet/aq-route-probe", []byte("{}"))
	if err != nil {
		return &abortError{fmt.Errorf("POST /fleet/aq-route-probe: %w", err)}
	}
	if ex.Header.Get("Date") != "" {
		c.present(RuleDateHeader)
	} else {
		c.missing(RuleDateHeader, "no Date header in the answers")
	}
	switch ex.Status {
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		c.present(RuleUnknownRoute)
	default:
		c.wrong(RuleUnknownRoute, fmt.Sprintf("POST /fleet/aq-route-probe answered %d %s", ex.Status, http.StatusText(ex.Status)))
	}
	none := c.name + "-none"
	ex, err = c.exchange(ctx, c.op, http.MethodGet, "/fleet/jobs/"+url.PathEscape(none), nil)
	if err != nil {
		return &abortError{fmt.Errorf("GET /fleet/jobs/:id: %w", err)}
	}
	switch {
	case ex.Status == http.StatusNotFound && ex.JSON():
		c.present(RuleUnknownJob)
	case ex.Status == http.StatusNotFound:
		c.missing(RuleUnknownJob, "404 without a JSON body")
	case ex.Status >= 200 && ex.Status < 300:
		c.wrong(RuleUnknownJob, fmt.Sprintf("GET /fleet/jobs/%s (no such job) answered %d", none, ex.Status))
	default:
		c.wrong(RuleUnknownJob, fmt.Sprintf("GET /fleet/jobs/%s (no such job) answered %d %s", none, ex.Status, http.StatusText(ex.Status)))
	}
	return nil
}

// exchange is Client.Exchange retried as the typed calls are: on no answer,
// 429 and 5xx (but 501), within the Claim budget.
func (c *checker) exchange(ctx context.Context, cl *fleet.Client, method, path string, body []byte) (*fleet.Exchange, error) {
	deadline := time.Now().Add(cl.Budgets().Claim)
	b := cl.Budgets()
	for n := 0; ; n++ {
		ex, err := cl.Exchange(ctx, method, path, body)
		again := err != nil || ex.Status == http.StatusTooManyRequests || ex.Status >= 500 && ex.Status != http.StatusNotImplemented
		if !again || time.Now().After(deadline) {
			return ex, err
		}
		if err := sleep(ctx, fleet.Backoff(b.MinWait, b.MaxWait, n, nil, mrand.Float64)); err != nil {
			return nil, err
		}
	}
}

func (c *checker) heartbeat(ctx context.Context) error {
	caps, repos := c.offer()
	err := c.fac.Heartbeat(ctx, fleet.HeartbeatRequest{Capabilities: caps, Repos: repos, SeatLimit: 1, Health: "ok", Running: []fleet.RunningJob{}, Version: c.o.Version})
	_, stop := c.route(fleet.RouteHeartbeat, err)
	return stop
}

func (c *checker) jobA() string { return c.name + "-a" }
func (c *checker) jobB() string { return c.name + "-b" }

// submit posts one of the check's jobs.
func (c *checker) submit(ctx context.Context, id string) (*fleet.SubmitAnswer, error) {
	j, text, err := c.manifest(id, "")
	if err != nil {
		return nil, err
	}
	return c.op.Submit(ctx, j, text)
}

// manifest is one of the check's jobs, parsed as aq submit parses it.
func (c *checker) manifest(id, note string) (*job.Job, []byte, error) {
	text := []byte(c.manifestText(id, note))
	j, err := manifest.Parse(id+".md", text, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("the check's own manifest: %w", err)
	}
	return j, text, nil
}

// replace gives the check's queued job id a new manifest (PUT
// /fleet/jobs/:id): it must go back to queued.
func (c *checker) replace(ctx context.Context, id string) error {
	j, text, err := c.manifest(id, "\n\nReplaced by the check (aq submit --replace).")
	if err != nil {
		return &abortError{err}
	}
	a, err := c.op.ReplaceJob(ctx, j, text)
	if ok, stop := c.route(fleet.RouteReplace, err); stop != nil {
		return stop
	} else if ok && a.Stage != "" && a.Stage != job.Inbox.FleetName() {
		c.force(fleet.RouteReplace, Wrong, "the replaced job went to stage "+a.Stage+", not queued")
	}
	return nil
}

// submitA: the queue-state version before and after, submit, a re-sent
// submit, the job and the job list.
func (c *checker) submitA(ctx context.Context) error {
	v0, qerr := c.fac.QueueState(ctx)
	if _, stop := c.route(fleet.RouteQueueState, qerr); stop != nil {
		return stop
	}
	a, err := c.submit(ctx, c.jobA())
	ok, stop := c.route(fleet.RouteSubmit, err)
	if stop != nil || !ok {
		if stop == nil {
			stop = &abortError{fmt.Errorf("%s refused the check's job: %s", fleet.RouteSubmit, answer(err))}
		}
		return stop
	}
	c.rep.Jobs = append(c.rep.Jobs, c.jobA())
	if a.JobID != c.jobA() {
		c.row(fleet.RouteSubmit).Seen = "answered jobId " + a.JobID + " for " + c.jobA()
	}
	again, err := c.submit(ctx, c.jobA())
	var fe *fleet.FencedError
	switch {
	case err == nil && again.JobID == c.jobA():
		c.present(RuleSubmitResend)
	case err == nil:
		c.wrong(RuleSubmitResend, "the re-sent submit answered another job, "+again.JobID)
	case errors.As(err, &fe):
		c.missing(RuleSubmitResend, answer(err))
	case fleet.IsTransient(err):
		return &abortError{err}
	default:
		c.wrong(RuleSubmitResend, answer(err))
	}
	switch v1, err := c.fac.QueueState(ctx); {
	case qerr != nil:
		c.unchecked(RuleVersionMoves, "no "+fleet.RouteQueueState)
	case err != nil:
		return &abortError{err}
	case v1.Version == v0.Version:
		c.wrong(RuleVersionMoves, fmt.Sprintf("the version stayed %d across a submit", v0.Version))
	default:
		c.present(RuleVersionMoves)
	}
	j, err := c.op.Job(ctx, c.jobA())
	if ok, stop := c.route(fleet.RouteJob, err); stop != nil {
		return stop
	} else if ok && j.ID != c.jobA() {
		c.force(fleet.RouteJob, Wrong, "answered a job with id "+j.ID)
	}
	jobs, err := c.op.Jobs(ctx)
	if ok, stop := c.route(fleet.RouteJobs, err); stop != nil {
		return stop
	} else if ok && !slices.ContainsFunc(jobs, func(d fleet.JobDoc) bool { return d.ID == c.jobA() }) {
		c.force(fleet.RouteJobs, Wrong, "the list does not hold the job just submitted")
	}
	return nil
}

// lease takes the lease on id: by accept when the coordinator has it and
// viaAccept is set, else by claim. A claim that hands out a job not the
// check's gives it back at once, unstarted, and the check leases its own by
// accept (or stops, without accept).
func (c *checker) lease(ctx context.Context, id string, viaAccept bool) (*fleet.Claim, error) {
	if viaAccept {
		if cl, done, err := c.accept(ctx, id); done {
			return cl, err
		}
	}
	cl, err := c.fac.Claim(ctx, false)
	if err != nil {
		if _, stop := c.route(fleet.RouteClaim, err); stop != nil {
			return nil, stop
		}
		return nil, &abortError{fmt.Errorf("%s: %s", fleet.RouteClaim, answer(err))}
	}
	switch {
	case cl == nil:
		c.wrong(fleet.RouteClaim, "answered 204 (no job) with the check's job "+id+" queued for it")
		return nil, &abortError{fmt.Errorf("%s handed out no job: the check's job %s stays queued", fleet.RouteClaim, id)}
	case cl.Job.ID != id && !c.ours(cl.Job.ID):
		c.giveBack(ctx, cl)
		c.present(fleet.RouteClaim)
		if cl, done, err := c.accept(ctx, id); done {
			return cl, err
		}
		return nil, &abortError{fmt.Errorf("%s handed the check %s, a job not its own (it needs no capability the check lacks), before the check's %s; given back at once, unstarted: run the check again when that job has gone", fleet.RouteClaim, cl.Job.ID, id)}
	case cl.Job.ID != id:
		c.held[cl.Job.ID] = cl.LeaseEpoch
		return nil, &abortError{fmt.Errorf("%s handed out %s, not %s", fleet.RouteClaim, cl.Job.ID, id)}
	case cl.LeaseEpoch <= 0:
		c.held[id] = cl.LeaseEpoch
		c.wrong(fleet.RouteClaim, "the answer carries no leaseEpoch")
		return cl, nil
	}
	c.held[id] = cl.LeaseEpoch
	if cl.LeaseExpiresAt.IsZero() {
		c.row(fleet.RouteClaim).Seen = "the answer carries no leaseExpiresAt (aq assumes 90 s)"
	}
	c.present(fleet.RouteClaim)
	return cl, nil
}

// accept leases id with POST /fleet/accept; done is false when the
// coordinator has no accept (the caller claims instead).
func (c *checker) accept(ctx context.Context, id string) (cl *fleet.Claim, done bool, err error) {
	if !c.fac.Has(fleet.RouteAccept) {
		return nil, false, nil
	}
	cl, err = c.fac.Accept(ctx, id)
	ok, stop := c.route(fleet.RouteAccept, err)
	switch {
	case stop != nil:
		return nil, true, stop
	case ok:
		c.held[id] = cl.LeaseEpoch
		return cl, true, nil
	case !c.fac.Has(fleet.RouteAccept):
		return nil, false, nil
	}
	return nil, true, &abortError{fmt.Errorf("%s refused the check's own queued job %s: %s", fleet.RouteAccept, id, answer(err))}
}

// ours reports whether id is one of the check's jobs.
func (c *checker) ours(id string) bool { return strings.HasPrefix(id, c.name+"-") }

// giveBack releases a job not the check's that a claim handed it, at once,
// and records it in the report.
func (c *checker) giveBack(ctx context.Context, cl *fleet.Claim) {
	note := cl.Job.ID
	if err := c.fac.Release(context.WithoutCancel(ctx), cl.Job.ID, cl.LeaseEpoch); err != nil {
		note += " (the release failed: " + answer(err) + "; its lease frees when it expires)"
	}
	c.rep.GivenBack = append(c.rep.GivenBack, note)
}

func (c *checker) checkpoint(n int) string {
	s := sha256.Sum256([]byte(c.name + fmt.Sprint(n)))
	return hex.EncodeToString(s[:20])
}

// leaseA: claim A, report building (and re-send it), two checkpoints,
// renew, release; lease A again and see the checkpoint it carries; a stale
// epoch's PATCH and renewal.
func (c *checker) leaseA(ctx context.Context) error {
	a := c.jobA()
	cl, err := c.lease(ctx, a, false)
	if err != nil {
		return err
	}
	e1 := cl.LeaseEpoch
	building := fleet.PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: e1}
	_, err = c.fac.Patch(ctx, a, building)
	if ok, stop := c.route(fleet.RoutePatch, err); stop != nil || !ok {
		return or(stop, fmt.Errorf("%s refused the holder's building report: %s", fleet.RoutePatch, answer(err)))
	}
	var resends []string
	if _, err := c.fac.Patch(ctx, a, building); err != nil {
		if fleet.IsTransient(err) {
			return &abortError{err}
		}
		resends = append(resends, "a re-sent building PATCH "+answer(err))
	}
	cp1, cp2 := c.checkpoint(1), c.checkpoint(2)
	for _, cp := range []string{cp1, cp2} {
		p := building
		p.Checkpoint = cp
		if _, err := c.fac.Patch(ctx, a, p); err != nil {
			if fleet.IsTransient(err) {
				return &abortError{err}
			}
			c.wrong(RuleCheckpoint, "a building PATCH with checkpoint "+cp[:8]+"… "+answer(err))
		}
	}
	l, err := c.fac.Renew(ctx, a, e1)
	if ok, stop := c.route(fleet.RouteRenew, err); stop != nil || !ok {
		return or(stop, fmt.Errorf("%s refused the holder: %s", fleet.RouteRenew, answer(err)))
	}
	if l.ExpiresAt.IsZero() {
		c.row(fleet.RouteRenew).Seen = "the answer carries no leaseExpiresAt"
	}
	err = c.fac.Release(ctx, a, e1)
	if ok, stop := c.route(fleet.RouteRelease, err); stop != nil || !ok {
		return or(stop, fmt.Errorf("%s refused the holder: %s", fleet.RouteRelease, answer(err)))
	}
	delete(c.held, a)
	cl, err = c.lease(ctx, a, true)
	if err != nil {
		return err
	}
	e2 := cl.LeaseEpoch
	switch got := cl.Job.Checkpoint; got {
	case cp2:
		c.present(RuleCheckpoint)
	case cp1:
		c.wrong(RuleCheckpoint, "the job was handed out again with the first checkpoint: the second, re-sent in a building PATCH, was dropped")
	case "":
		c.wrong(RuleCheckpoint, "the job was handed out again without a checkpoint")
	default:
		c.wrong(RuleCheckpoint, "the job was handed out again with checkpoint "+got)
	}
	c.staleEpoch(ctx, a, e1, e2)
	c.resends = append(c.resends, resends...)
	c.epochA = e2
	return c.liveLog(ctx, a, e1, e2)
}

// liveLog writes A's run at epoch cur as a factory streams it — a line, its
// re-send, a gap, an offset that does not follow, a chunk of the stale
// epoch old, the end — and reads it back as a follower does.
func (c *checker) liveLog(ctx context.Context, id string, old, cur int64) error {
	text := "aq fleet check: a line of " + id + "'s engine\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(text))
	_ = zw.Close()
	n := int64(len(text))
	line := fleet.LogChunk{Attempt: 1, LeaseEpoch: cur, Seq: 1, Offset: 0, Kind: fleet.LogOutput, Size: n,
		Encoding: "gzip", Data: base64.StdEncoding.EncodeToString(gz.Bytes())}
	_, err := c.fac.AppendLog(ctx, id, line)
	wrote, stop := c.route(fleet.RouteLogAppend, err)
	if stop != nil {
		return stop
	}
	var wrong []string
	if wrote {
		expect := func(what string, ch fleet.LogChunk, next int64, want string) {
			a, err := c.fac.AppendLog(ctx, id, ch)
			var got string
			if le, ok := fleet.IsLogOffset(err); ok {
				if want == "416" && le.Next == next {
					return
				}
				got = fmt.Sprintf("416 with next %d", le.Next)
			}
			switch {
			case got != "":
			case want == "409" && fleet.IsFenced(err):
				return
			case err == nil && want == "200" && a.Next == next:
				return
			case err == nil:
				got = fmt.Sprintf("200 with next %d", a.Next)
			default:
				got = answer(err)
			}
			wrong = append(wrong, fmt.Sprintf("%s: %s, want %s (next %d)", what, got, want, next))
		}
		expect("the line re-sent", line, n, "200")
		expect("a gap", fleet.LogChunk{Attempt: 1, LeaseEpoch: cur, Seq: 2, Offset: n, Kind: fleet.LogGap, Size: 100}, n+100, "200")
		expect("an offset that does not follow", fleet.LogChunk{Attempt: 1, LeaseEpoch: cur, Seq: 3, Offset: 3, Kind: fleet.LogGap, Size: 1}, n+100, "416")
		expect("a chunk of the stale epoch", fleet.LogChunk{Attempt: 1, LeaseEpoch: old, Seq: 9, Offset: 0, Kind: fleet.LogGap, Size: 1}, 0, "409")
		expect("the end", fleet.LogChunk{Attempt: 1, LeaseEpoch: cur, Seq: 3, Offset: n + 100, Kind: fleet.LogOutput, End: true}, n+100, "200")
	}
	p, err := c.op.ReadLog(ctx, id, fleet.LogQuery{Epoch: cur})
	read, stop := c.route(fleet.RouteLogRead, err)
	switch {
	case stop != nil:
		return stop
	case !wrote:
		c.unchecked(RuleLogRoutes, "no live log was written")
		return nil
	case !read:
		c.unchecked(RuleLogRoutes, "the live log could not be read")
		return nil
	}
	want := []fleet.LogRecord{{Offset: 0, Kind: fleet.LogOutput, Size: n, Text: text}, {Offset: n, Kind: fleet.LogGap, Size: 100}}
	switch {
	case !slices.Equal(p.Records, want):
		wrong = append(wrong, fmt.Sprintf("read back %d records (next %d), not the line and the gap written", len(p.Records), p.Next))
	case !p.Ended:
		wrong = append(wrong, "the run is not ended after its end")
	}
	if len(wrong) > 0 {
		c.wrong(RuleLogRoutes, strings.Join(wrong, "; "))
		return nil
	}
	c.present(RuleLogRoutes)
	return nil
}

// staleEpoch writes with epoch old while new is the job's.
func (c *checker) staleEpoch(ctx context.Context, id string, old, cur int64) {
	if old == cur {
		c.wrong(RuleStaleEpoch, fmt.Sprintf("the job was leased again at the same epoch %d", cur))
		return
	}
	var took []string
	if _, err := c.fac.Patch(ctx, id, fleet.PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: old}); !fleet.IsFenced(err) {
		took = append(took, fmt.Sprintf("a building PATCH at stale epoch %d (current %d) %s", old, cur, outcome(err)))
	}
	if _, err := c.fac.Renew(ctx, id, old); !fleet.IsFenced(err) {
		took = append(took, fmt.Sprintf("a renewal at stale epoch %d %s", old, outcome(err)))
	}
	if len(took) > 0 {
		c.wrong(RuleStaleEpoch, strings.Join(took, "; "))
		return
	}
	c.present(RuleStaleEpoch)
}

// outcome is answer for a call that may have succeeded.
func outcome(err error) string {
	if err == nil {
		return "was taken (2xx)"
	}
	return answer(err)
}

func or(stop, otherwise error) error {
	if stop != nil {
		return stop
	}
	return &abortError{otherwise}
}

// finishA: the terminal report and its re-send, the lease after it, A's
// artifacts.
func (c *checker) finishA(ctx context.Context) error {
	a, e2 := c.jobA(), c.epochA
	done := fleet.PatchRequest{Stage: job.Testing.FleetName(), LeaseEpoch: e2, Checkpoint: c.checkpoint(2), Branch: "aq/job/" + a,
		Insights: &job.Insights{Engine: "script", Turns: 1, WallMS: 1}}
	if _, err := c.fac.Patch(ctx, a, done); err != nil {
		if fleet.IsTransient(err) {
			return &abortError{err}
		}
		c.force(fleet.RoutePatch, Wrong, "the holder's terminal report (testing) "+answer(err))
		return &abortError{fmt.Errorf("%s refused the holder's terminal report: %s", fleet.RoutePatch, answer(err))}
	}
	delete(c.held, a)
	if _, err := c.fac.Patch(ctx, a, done); err != nil {
		if fleet.IsTransient(err) {
			return &abortError{err}
		}
		c.resends = append(c.resends, "a re-sent terminal PATCH (testing) "+answer(err))
	}
	switch _, err := c.fac.Renew(ctx, a, e2); {
	case err == nil:
		c.wrong(RuleTerminalEnds, "a renewal after the terminal report was taken (2xx)")
	case fleet.IsFenced(err), errors.Is(err, fleet.ErrGone):
		c.present(RuleTerminalEnds)
	case fleet.IsTransient(err):
		return &abortError{err}
	default:
		c.wrong(RuleTerminalEnds, "a renewal after the terminal report "+answer(err))
	}
	return c.artifacts(ctx, a, e2)
}

// artifacts uploads one small artifact of A (as the factory does after its
// terminal report), lists it and reads it back.
func (c *checker) artifacts(ctx context.Context, id string, epoch int64) error {
	content := []byte("aq fleet check: the engine's output of " + id + "\n")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(content)
	_ = zw.Close()
	sum := sha256.Sum256(content)
	up := fleet.ArtifactUpload{Name: "engine-stdout", Kind: "transcript", ContentType: "text/plain; charset=utf-8", Encoding: "gzip",
		Size: int64(len(content)), OriginalSize: int64(len(content)), SHA256: hex.EncodeToString(sum[:]), Attempt: 2, LeaseEpoch: epoch,
		Data: base64.StdEncoding.EncodeToString(gz.Bytes())}
	_, err := c.fac.UploadArtifact(ctx, id, up, c.fac.Budgets().Report)
	uploaded, stop := c.route(fleet.RouteArtifacts, err)
	if stop != nil {
		return stop
	}
	arts, err := c.op.JobArtifacts(ctx, id)
	listed, stop := c.route(fleet.RouteArtifactList, err)
	if stop != nil {
		return stop
	}
	var doc *fleet.ArtifactDoc
	for i := range arts {
		if arts[i].Name == up.Name {
			doc = &arts[i]
		}
	}
	switch {
	case !uploaded:
		c.unchecked(fleet.RouteArtifactGet, "no artifact was uploaded")
		c.unchecked(RuleArtifactsBytes, "no artifact was uploaded")
		return nil
	case !listed:
		c.unchecked(fleet.RouteArtifactGet, "no list to find the artifact in")
		c.unchecked(RuleArtifactsBytes, "no list to find the artifact in")
		return nil
	case doc == nil:
		c.force(fleet.RouteArtifactList, Wrong, "the list does not hold the artifact just uploaded")
		c.unchecked(fleet.RouteArtifactGet, "the artifact is not listed")
		c.unchecked(RuleArtifactsBytes, "the artifact is not listed")
		return nil
	}
	got, err := c.op.ArtifactContent(ctx, *doc)
	if ok, stop := c.route(fleet.RouteArtifactGet, err); stop != nil || !ok {
		c.unchecked(RuleArtifactsBytes, "the artifact could not be read")
		return stop
	}
	if bytes.Equal(got, content) {
		c.present(RuleArtifactsBytes)
	} else {
		c.wrong(RuleArtifactsBytes, fmt.Sprintf("read back %d bytes, not the %d uploaded", len(got), len(content)))
	}
	return nil
}

// operatorReads: A's events, an operator action on A (ship: it is in
// testing), the factories list.
func (c *checker) operatorReads(ctx context.Context) error {
	a := c.jobA()
	evs, err := c.op.JobEvents(ctx, a)
	if ok, stop := c.route(fleet.RouteEvents, err); stop != nil {
		return stop
	} else if ok && len(evs) == 0 {
		c.row(fleet.RouteEvents).Seen = "no events for a job that was submitted, leased and reported"
	}
	j, err := c.op.JobAction(ctx, a, "ship", "")
	if ok, stop := c.route(fleet.RouteAction, err); stop != nil {
		return stop
	} else if ok && j.Stage != "" && j.Stage != job.Shipped.FleetName() {
		c.force(fleet.RouteAction, Wrong, "ship answered stage "+j.Stage)
	}
	fs, err := c.op.Factories(ctx)
	if ok, stop := c.route(fleet.RouteFactories, err); stop != nil {
		return stop
	} else if ok && !slices.ContainsFunc(fs, func(f fleet.FactoryDoc) bool { return f.ID == c.factory }) {
		c.row(fleet.RouteFactories).Seen = "the list does not hold the check's factory"
	}
	return nil
}

// parkB: lease B, see a second accept refused, report building, park it
// with notBefore; see it held (a claim does not hand it out), then handed
// out after notBefore, its attempt not counted; end it.
func (c *checker) parkB(ctx context.Context) error {
	b := c.jobB()
	if _, err := c.submit(ctx, b); err != nil {
		if fleet.IsTransient(err) {
			return &abortError{err}
		}
		return &abortError{fmt.Errorf("%s refused the check's second job: %s", fleet.RouteSubmit, answer(err))}
	}
	c.rep.Jobs = append(c.rep.Jobs, b)
	if err := c.replace(ctx, b); err != nil {
		return err
	}
	cl, err := c.lease(ctx, b, true)
	if err != nil {
		return err
	}
	epoch, attempts := cl.LeaseEpoch, cl.Job.Attempts
	if c.fac.Has(fleet.RouteAccept) {
		again, err := c.fac.Accept(ctx, b)
		switch {
		case fleet.IsFenced(err):
			c.present(RuleAcceptHeld)
		case err == nil:
			c.wrong(RuleAcceptHeld, fmt.Sprintf("a second accept of the job the check holds was taken: epoch %d, then %d", epoch, again.LeaseEpoch))
			epoch, attempts = again.LeaseEpoch, again.Job.Attempts
			c.held[b] = epoch
		case fleet.IsTransient(err):
			return &abortError{err}
		default:
			c.wrong(RuleAcceptHeld, "a second accept of the job the check holds "+answer(err))
		}
	} else {
		c.unchecked(RuleAcceptHeld, "no "+fleet.RouteAccept)
	}
	if _, err := c.fac.Patch(ctx, b, fleet.PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: epoch}); err != nil {
		if fleet.IsTransient(err) {
			return &abortError{err}
		}
		c.force(fleet.RoutePatch, Wrong, "the holder's building report "+answer(err))
		return &abortError{fmt.Errorf("%s refused the holder's building report: %s", fleet.RoutePatch, answer(err))}
	}
	// notBefore on the coordinator's clock.
	nb := time.Now().Add(c.skew + c.o.Park).UTC().Truncate(time.Second).Add(time.Second)
	park := fleet.FailRequest{JobID: b, LeaseEpoch: epoch, Reason: job.ReasonRateLimited, Retryable: true, Checkpoint: c.checkpoint(3),
		Detail: "aq fleet check: a park until notBefore", NotBefore: nb}
	stage, err := c.fac.Fail(ctx, park, false)
	if stop := c.failed(err, "the park"); stop != nil {
		return stop
	}
	delete(c.held, b)
	hasFail := c.fac.Has(fleet.RouteFail)
	if hasFail {
		if stage != "" && stage != job.Inbox.FleetName() {
			c.row(fleet.RouteFail).Seen = "the park answered stage " + stage + ", not queued"
		}
		if _, err := c.fac.Fail(ctx, park, false); err != nil {
			if fleet.IsTransient(err) {
				return &abortError{err}
			}
			c.resends = append(c.resends, "a re-sent /fleet/fail "+answer(err))
		}
	}
	c.setResend()
	if !hasFail {
		c.row(RuleResend).Seen = "PATCH re-sends only: no " + fleet.RouteFail
	}
	// Held: a claim now must not hand B out.
	sent := time.Now()
	cl, err = c.fac.Claim(ctx, false)
	if err != nil {
		if fleet.IsTransient(err) {
			return &abortError{err}
		}
		return &abortError{fmt.Errorf("%s: %s", fleet.RouteClaim, answer(err))}
	}
	switch {
	case cl != nil && cl.Job.ID == b:
		c.held[b] = cl.LeaseEpoch
		if !sent.Add(c.skew).Before(nb) {
			c.unchecked(RuleParkHolds, "the claim after the park went out after its notBefore: run the check with a longer --park")
		} else {
			c.missing(RuleParkHolds, "a claim right after the park handed the job out again")
		}
		c.unchecked(RuleVersionDue, "the park did not hold the job")
	case cl != nil && !c.ours(cl.Job.ID):
		// Not the check's: given back; whether the park held is not known.
		c.giveBack(ctx, cl)
		c.unchecked(RuleParkHolds, "the claim after the park handed out "+cl.Job.ID+", a job not the check's (given back at once, unstarted)")
		c.unchecked(RuleVersionDue, "whether the park held the job is not known")
		if cl, err = c.afterPark(ctx, b, nb); err != nil {
			return err
		}
		if cl == nil {
			c.unchecked(RuleParkNoAttempt, "the job did not come back")
			return nil
		}
	case cl != nil:
		c.held[cl.Job.ID] = cl.LeaseEpoch
		return &abortError{fmt.Errorf("%s handed out %s while waiting for %s", fleet.RouteClaim, cl.Job.ID, b)}
	default:
		// Held. Wait for notBefore: the queue-state version must move
		// when it passes, and the job must come back.
		if err := c.versionDue(ctx, nb); err != nil {
			return err
		}
		if cl, err = c.afterPark(ctx, b, nb); err != nil {
			return err
		}
		if cl == nil {
			c.wrong(RuleParkHolds, "the job was not handed out within 30 s after its notBefore")
			c.unchecked(RuleParkNoAttempt, "the job did not come back")
			return nil
		}
		c.present(RuleParkHolds)
	}
	c.previous(cl, park)
	switch got := cl.Job.Attempts; {
	case attempts == 0 || got == 0:
		c.unchecked(RuleParkNoAttempt, "the job document carries no attempts count")
	case got == attempts:
		c.present(RuleParkNoAttempt)
	default:
		c.missing(RuleParkNoAttempt, fmt.Sprintf("attempts %d before the park, %d when handed out again", attempts, got))
	}
	// The end: a failure no retry follows.
	end := fleet.FailRequest{JobID: b, LeaseEpoch: cl.LeaseEpoch, Reason: job.ReasonRejected, Retryable: false, Detail: "aq fleet check: the check's job ends here"}
	if _, err := c.fac.Fail(ctx, end, true); err != nil {
		return c.failed(err, "the end of the check's job")
	}
	delete(c.held, b)
	return nil
}

// previous checks that the parked job, handed out again, says how its
// last run ended: the park's reason and detail.
func (c *checker) previous(cl *fleet.Claim, park fleet.FailRequest) {
	p := cl.Job.Previous
	switch {
	case p == nil:
		c.missing(RulePrevious, "the job came back without previous")
	case p.Reason != park.Reason || !strings.Contains(p.Detail, park.Detail):
		c.wrong(RulePrevious, fmt.Sprintf("previous says %s (%q), the run reported %s (%q)", p.Reason, p.Detail, park.Reason, park.Detail))
	default:
		c.present(RulePrevious)
	}
}

// failed records a /fleet/fail that did not go through, or went through
// as its fallback (a fenced PATCH, then lease/release).
func (c *checker) failed(err error, what string) error {
	switch {
	case err == nil && !c.fac.Has(fleet.RouteFail):
		c.missing(fleet.RouteFail, "absent")
		return nil
	case err == nil:
		c.present(fleet.RouteFail)
		return nil
	case fleet.IsTransient(err):
		return &abortError{err}
	}
	c.force(fleet.RouteFail, Wrong, what+" "+answer(err))
	return &abortError{fmt.Errorf("%s (%s) %s", fleet.RouteFail, what, answer(err))}
}

// versionDue reads the queue-state version while a parked job waits, and
// again from its notBefore until it moves (at most 10 s): a job claimable
// by time alone must move it, or gated factories do not see it.
func (c *checker) versionDue(ctx context.Context, nb time.Time) error {
	if !c.fac.Has(fleet.RouteQueueState) {
		c.unchecked(RuleVersionDue, "no "+fleet.RouteQueueState)
		return nil
	}
	v1, err := c.fac.QueueState(ctx)
	if err != nil {
		return &abortError{err}
	}
	local := nb.Add(-c.skew)
	if err := sleep(ctx, time.Until(local)); err != nil {
		return &abortError{err}
	}
	for deadline := local.Add(10 * time.Second); ; {
		v, err := c.fac.QueueState(ctx)
		switch {
		case err != nil:
			return &abortError{err}
		case v.Version != v1.Version:
			c.present(RuleVersionDue)
			return nil
		case time.Now().After(deadline):
			c.wrong(RuleVersionDue, fmt.Sprintf("the version stayed %d for 10 s after the parked job's notBefore", v1.Version))
			return nil
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return &abortError{err}
		}
	}
}

// afterPark claims (or accepts) until id is handed out, from notBefore to
// 30 s after it.
func (c *checker) afterPark(ctx context.Context, id string, nb time.Time) (*fleet.Claim, error) {
	local := nb.Add(-c.skew)
	deadline := local.Add(30 * time.Second)
	if err := sleep(ctx, time.Until(local)); err != nil {
		return nil, &abortError{err}
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		var (
			cl  *fleet.Claim
			err error
		)
		if c.fac.Has(fleet.RouteAccept) {
			cl, err = c.fac.Accept(ctx, id)
			if fleet.IsFenced(err) {
				cl, err = nil, nil // not due yet
			}
		} else {
			cl, err = c.fac.Claim(ctx, false)
		}
		switch {
		case err != nil && fleet.IsTransient(err):
			return nil, &abortError{err}
		case err != nil:
			return nil, &abortError{fmt.Errorf("leasing the parked job: %s", answer(err))}
		case cl != nil && cl.Job.ID == id:
			c.held[id] = cl.LeaseEpoch
			return cl, nil
		case cl != nil && !c.ours(cl.Job.ID):
			c.giveBack(ctx, cl)
			return nil, &abortError{fmt.Errorf("%s handed the check %s, a job not its own, while it waited for %s; given back at once, unstarted", fleet.RouteClaim, cl.Job.ID, id)}
		case cl != nil:
			c.held[cl.Job.ID] = cl.LeaseEpoch
			return nil, &abortError{fmt.Errorf("%s handed out %s while waiting for %s", fleet.RouteClaim, cl.Job.ID, id)}
		}
		if time.Now().After(deadline) {
			return nil, nil
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, &abortError{err}
		}
	}
}

// sleep waits d or until ctx ends (fleet.RealClock's wait).
func sleep(ctx context.Context, d time.Duration) error { return fleet.RealClock{}.Sleep(ctx, d) }

// setResend gives the re-send rule its verdict from what was re-sent.
func (c *checker) setResend() {
	if len(c.resends) > 0 {
		c.wrong(RuleResend, strings.Join(c.resends, "; "))
		return
	}
	c.present(RuleResend)
}

// cleanup gives back every lease the check still holds (a failure no retry
// follows), deregisters the check's factory and lists what stays on the
// coordinator. It runs even when the check stopped early or ctx ended.
func (c *checker) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for id, epoch := range c.held {
		end := fleet.FailRequest{JobID: id, LeaseEpoch: epoch, Reason: job.ReasonRejected, Retryable: false, Detail: "aq fleet check: the check's job ends here"}
		_, err := c.fac.Fail(ctx, end, true)
		if err != nil && !fleet.IsFenced(err) {
			err = c.fac.Release(ctx, id, epoch)
		}
		if err == nil || fleet.IsFenced(err) {
			delete(c.held, id) // ended, or no longer the check's
		}
	}
	// A job of the check's that is still queued (the check stopped before
	// it leased it) is rejected, when the coordinator has the action.
	for _, id := range c.rep.Jobs {
		if j, err := c.op.Job(ctx, id); err == nil && (j.Stage == job.Inbox.FleetName() || j.Stage == job.Blocked.FleetName()) && c.op.Has(fleet.RouteAction) {
			_, _ = c.op.JobAction(ctx, id, "reject", "aq fleet check: the check's job ends here")
		}
	}
	err := c.fac.Deregister(ctx)
	switch {
	case c.row(fleet.RouteDeregister).Verdict != "":
	case err == nil && c.fac.Has(fleet.RouteDeregister):
		c.present(fleet.RouteDeregister)
	case err == nil:
		c.missing(fleet.RouteDeregister, "absent")
	case fleet.IsTransient(err):
		c.unchecked(fleet.RouteDeregister, "the coordinator did not answer: "+err.Error())
	default:
		c.wrong(fleet.RouteDeregister, answer(err))
	}
	state := "deregistered"
	if !c.fac.Has(fleet.RouteDeregister) || err != nil {
		state = "registered: stale once its heartbeats stop"
	}
	c.rep.Left = append(c.rep.Left, Record{Kind: "factory", ID: c.factory, State: state})
	for _, id := range c.rep.Jobs {
		if st, gone := c.remove(ctx, id); !gone {
			c.rep.Left = append(c.rep.Left, Record{Kind: "job", ID: id, State: st})
		}
	}
	if r := c.row(fleet.RouteRemove); r.Verdict == "" && len(c.rep.Jobs) == 0 {
		c.unchecked(fleet.RouteRemove, "the check submitted no job")
	}
}

// remove deletes one of the check's jobs once it ended (DELETE
// /fleet/jobs/:id); gone says it is no longer on the coordinator, else st is
// its stage.
func (c *checker) remove(ctx context.Context, id string) (st string, gone bool) {
	st = "unknown"
	if j, err := c.op.Job(ctx, id); err == nil {
		st = j.Stage
	}
	if _, held := c.held[id]; held || !c.op.Has(fleet.RouteRemove) {
		return st, false
	}
	_, err := c.op.RemoveJob(ctx, id)
	switch {
	case err == nil:
		c.present(fleet.RouteRemove)
		return st, true
	case fleet.IsRouteAbsent(err):
		c.missing(fleet.RouteRemove, "absent ("+evidence(err)+")")
	case fleet.IsTransient(err):
		c.unchecked(fleet.RouteRemove, "the coordinator did not answer: "+err.Error())
	default:
		c.wrong(fleet.RouteRemove, fmt.Sprintf("removing the check's job %s (%s) %s", id, st, answer(err)))
	}
	return st, false
}

// force replaces row id's verdict (a later call showed it wrong).
func (c *checker) force(id string, v Verdict, seen string) {
	c.row(id).Verdict = ""
	c.set(id, v, seen)
}
