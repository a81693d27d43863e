package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/lifecycle"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/job"
)

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		out  runner.Outcome
		want lifecycle.Kind
	}{
		{runner.Outcome{Stage: job.Review}, lifecycle.Done},
		{runner.Outcome{Stage: job.Shipped}, lifecycle.Done},
		{runner.Outcome{Stage: job.Failed, Reason: job.ReasonEngineFailed}, lifecycle.Failed},
		{runner.Outcome{Stage: job.Failed, Reason: job.ReasonLeaseLost}, lifecycle.Failed},
		{runner.Outcome{Stage: job.Failed, Reason: job.ReasonInvalidManifest}, lifecycle.Failed},
		{runner.Outcome{Stage: job.Failed, Reason: job.ReasonRateLimited, Parked: "claude usage limit"}, lifecycle.Parked},
		{runner.Outcome{Stage: job.Failed, Reason: job.ReasonFenced, Fenced: true}, lifecycle.Fenced},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.out.Stage, tc.out.Reason), func(t *testing.T) {
			if got := lifecycle.Decide(tc.out); got != tc.want {
				t.Fatalf("Decide = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestOrder: one job's life, step by step, for each way it can end — the
// lease is held until the report settled (End after Report), the report
// goes out on the context Reporting gave (renewals take turns with it), and
// the recorder closes the job only after the lease ended.
func TestOrder(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rec        fakeRecorder
		lease      bool
		fenced     bool // the lease is fenced when the pipeline returns
		out        runner.Outcome
		wantCalls  string
		wantKind   lifecycle.Kind
		wantReason job.Reason
	}{
		{name: "done", lease: true, out: runner.Outcome{Stage: job.Review},
			wantCalls: "begin parse start pipeline reporting report:done end close", wantKind: lifecycle.Done},
		{name: "failed", lease: true, out: runner.Outcome{Stage: job.Failed, Reason: job.ReasonVerifyFailed},
			wantCalls: "begin parse start pipeline reporting report:failed end close", wantKind: lifecycle.Failed, wantReason: job.ReasonVerifyFailed},
		{name: "parked", lease: true, out: runner.Outcome{Stage: job.Failed, Reason: job.ReasonRateLimited, Parked: "codex usage limit"},
			wantCalls: "begin parse start pipeline reporting report:parked end close", wantKind: lifecycle.Parked, wantReason: job.ReasonRateLimited},
		{name: "fenced while it finished", lease: true, fenced: true, out: runner.Outcome{Stage: job.Shipped},
			wantCalls: "begin parse start pipeline reporting report:fenced end close", wantKind: lifecycle.Fenced, wantReason: job.ReasonFenced},
		{name: "invalid manifest", lease: true, rec: fakeRecorder{parseErr: errors.New("job.md:3: unknown key retyr")},
			wantCalls: "begin parse reporting report:failed end close", wantKind: lifecycle.Failed, wantReason: job.ReasonInvalidManifest},
		{name: "fenced before it started", lease: true, rec: fakeRecorder{startStop: &runner.Outcome{Stage: job.Failed, Reason: job.ReasonFenced, Fenced: true}},
			wantCalls: "begin parse start reporting report:fenced end close", wantKind: lifecycle.Fenced, wantReason: job.ReasonFenced},
		{name: "never started", lease: true, rec: fakeRecorder{gone: true},
			wantCalls: "begin close"},
		{name: "local: no lease", out: runner.Outcome{Stage: job.Testing},
			wantCalls: "begin parse start pipeline report:done close", wantKind: lifecycle.Done},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			rec := tc.rec
			rec.calls = &calls
			if tc.lease {
				rec.lease = &fakeLease{calls: &calls, fenced: tc.fenced}
			}
			pipe := pipelineFunc(func(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome {
				calls = append(calls, "pipeline")
				if (o.Lease != nil) != tc.lease {
					t.Errorf("the pipeline's lease: %v, want one: %v", o.Lease, tc.lease)
				}
				o.OnEvent(runner.EngineStarted{Engine: "script"})
				return tc.out
			})
			var seen []runner.Event
			lc := lifecycle.Lifecycle{Pipeline: pipe, OnEvent: func(id string, e runner.Event) { seen = append(seen, e) }}
			end := lc.Run(context.Background(), lifecycle.Job{ID: "j1", Repo: "app", Attempt: 1, Mode: "fleet"}, &rec)
			if got := strings.Join(calls, " "); got != tc.wantCalls {
				t.Fatalf("calls %q\nwant  %q", got, tc.wantCalls)
			}
			if rec.gone {
				return
			}
			if rec.kind != tc.wantKind || end.Outcome.Reason != tc.wantReason {
				t.Fatalf("reported %s with reason %q, want %s with %q", rec.kind, end.Outcome.Reason, tc.wantKind, tc.wantReason)
			}
			if tc.lease && !rec.onTurn {
				t.Fatal("the report did not go out on the context Reporting gave")
			}
			if strings.Contains(tc.wantCalls, "pipeline") {
				if len(rec.events) != 1 || !slices.Equal(seen, rec.events) {
					t.Fatalf("events: recorder %v, observer %v; want the engine's start, recorder first", rec.events, seen)
				}
			}
			if tc.rec.parseErr != nil && (end.Job != nil || end.Outcome.Detail != tc.rec.parseErr.Error()) {
				t.Fatalf("an invalid manifest ended as %+v", end)
			}
		})
	}
}

type pipelineFunc func(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome

func (f pipelineFunc) Run(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome {
	return f(ctx, j, o)
}

type turnKey struct{}

type fakeLease struct {
	calls  *[]string
	fenced bool
}

func (l *fakeLease) Confirm(context.Context) error { return nil }
func (l *fakeLease) Held(time.Duration) bool       { return !l.fenced }
func (l *fakeLease) Fenced() bool                  { return l.fenced }
func (l *fakeLease) End()                          { *l.calls = append(*l.calls, "end") }
func (l *fakeLease) Reporting(ctx context.Context) context.Context {
	*l.calls = append(*l.calls, "reporting")
	return context.WithValue(ctx, turnKey{}, l)
}

type fakeRecorder struct {
	calls     *[]string
	lease     *fakeLease
	gone      bool
	parseErr  error
	startStop *runner.Outcome

	events []runner.Event
	kind   lifecycle.Kind
	onTurn bool
}

func (r *fakeRecorder) Begin(context.Context, context.CancelCauseFunc) (lifecycle.Lease, *lifecycle.End) {
	*r.calls = append(*r.calls, "begin")
	if r.gone {
		return nil, &lifecycle.End{Settled: lifecycle.Settled{Stage: job.Inbox, Report: "released", Silent: true}}
	}
	if r.lease == nil {
		return nil, nil
	}
	return r.lease, nil
}

func (r *fakeRecorder) Parse() (*job.Job, error) {
	*r.calls = append(*r.calls, "parse")
	if r.parseErr != nil {
		return nil, r.parseErr
	}
	return &job.Job{ID: "j1", Repo: "app", Title: "a job"}, nil
}

func (r *fakeRecorder) Start(context.Context, *job.Job) *runner.Outcome {
	*r.calls = append(*r.calls, "start")
	return r.startStop
}

func (r *fakeRecorder) Event(_ context.Context, e runner.Event) { r.events = append(r.events, e) }

func (r *fakeRecorder) Report(ctx context.Context, k lifecycle.Kind, _ *job.Job, out *runner.Outcome) lifecycle.Settled {
	*r.calls = append(*r.calls, "report:"+k.String())
	r.kind, r.onTurn = k, ctx.Value(turnKey{}) != nil
	return lifecycle.Settled{Stage: out.Stage, Known: true, Report: "delivered"}
}

func (r *fakeRecorder) Close(context.Context, *lifecycle.End) { *r.calls = append(*r.calls, "close") }
