package job

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]int{"low": PriorityLow, "Normal": PriorityNormal, " high ": PriorityHigh, "critical": PriorityCritical, "0": 0, "1000": 1000, "250": 250} {
		got, err := ParsePriority(in)
		if err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"urgent", "-1", "1001", "", "1.5"} {
		if _, err := ParsePriority(bad); err == nil {
			t.Errorf("ParsePriority(%q) accepted", bad)
		}
	}
	if PriorityName(PriorityHigh) != "high" || PriorityName(250) != "250" {
		t.Error("PriorityName")
	}
}

func TestRetryPolicy(t *testing.T) {
	pol := Retry{Max: 2, Backoff: Duration(10 * time.Second)}
	cases := []struct {
		r        Reason
		attempts int
		want     bool
	}{
		{ReasonEngineFailed, 1, true},
		{ReasonEngineFailed, 2, true},
		{ReasonEngineFailed, 3, false},
		{ReasonVerifyFailed, 3, false},
		{ReasonEngineUnavailable, 3, true}, // infrastructure: extra tries
		{ReasonEngineUnavailable, 2 + InfraRetries, true},
		{ReasonEngineUnavailable, 3 + InfraRetries, false},
		{ReasonInvalidManifest, 1, false}, // permanent
		{ReasonFenced, 1, false},
		{ReasonRejected, 1, false},
	}
	for _, c := range cases {
		if got := Retryable(c.r, c.attempts, pol); got != c.want {
			t.Errorf("Retryable(%s, %d) = %v, want %v", c.r, c.attempts, got, c.want)
		}
	}
	if d := Backoff(ReasonEngineFailed, 1, pol); d != 10*time.Second {
		t.Errorf("first backoff %v", d)
	}
	if d := Backoff(ReasonEngineFailed, 3, pol); d != 40*time.Second {
		t.Errorf("third backoff %v (doubling)", d)
	}
	if d := Backoff(ReasonEngineFailed, 30, pol); d != time.Hour {
		t.Errorf("capped backoff %v", d)
	}
	if d := Backoff(ReasonEngineUnavailable, 1, Retry{Backoff: Duration(time.Second)}); d != 30*time.Second {
		t.Errorf("infra floor %v", d)
	}
	if d := Backoff(ReasonInterrupted, 2, pol); d != 0 {
		t.Errorf("interrupted backoff %v", d)
	}
}

func TestPrompt(t *testing.T) {
	j := &Job{Persona: "You are careful.", Body: "# Fix it\n\nDo X.\n\n## Acceptance\n- X works\n", Acceptance: "- X works"}
	p := j.Prompt(true)
	if !strings.HasPrefix(p, "You are careful.") || !strings.Contains(p, "Do X.") || !strings.Contains(p, "Definition of done") {
		t.Fatalf("prompt %q", p)
	}
	if strings.Contains(j.Prompt(false), "careful") {
		t.Fatal("persona included when the engine takes it separately")
	}
}

func TestStopReason(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	if _, _, ok := StopReason(ctx); ok {
		t.Fatal("live ctx reported stopped")
	}
	cancel(Stop(ReasonFenced, "409 on renew"))
	r, d, ok := StopReason(ctx)
	if !ok || r != ReasonFenced || d != "409 on renew" {
		t.Fatalf("got %v %q %v", r, d, ok)
	}
	child, c2 := context.WithCancel(ctx)
	defer c2()
	if r, _, _ := StopReason(child); r != ReasonFenced {
		t.Fatalf("child of a fenced ctx: %v", r)
	}
	plain, c3 := context.WithCancel(context.Background())
	c3()
	if r, _, _ := StopReason(plain); r != ReasonInterrupted {
		t.Fatalf("plain cancel: %v", r)
	}
	dl, c4 := context.WithTimeout(context.Background(), -time.Second)
	defer c4()
	if r, _, _ := StopReason(dl); r != ReasonTimeout {
		t.Fatalf("deadline: %v", r)
	}
}

func TestDurationJSON(t *testing.T) {
	var d Duration
	if err := json.Unmarshal([]byte(`"45m"`), &d); err != nil || d.D() != 45*time.Minute {
		t.Fatal(d, err)
	}
	if err := json.Unmarshal([]byte(`90`), &d); err != nil || d.D() != 90*time.Second {
		t.Fatal(d, err)
	}
	b, _ := json.Marshal(Duration(time.Minute))
	if string(b) != `"1m0s"` {
		t.Fatal(string(b))
	}
	if json.Unmarshal([]byte(`"soon"`), &d) == nil {
		t.Fatal("accepted a bad duration")
	}
}

func TestStages(t *testing.T) {
	if Inbox.FleetName() != "queued" || StageFromFleet("queued") != Inbox || StageFromFleet("assigned") != Building || StageFromFleet("review") != Review {
		t.Fatal("fleet stage mapping")
	}
	if !Shipped.Terminal() || !DeadLetter.Terminal() || Failed.Terminal() {
		t.Fatal("terminal stages")
	}
}

func TestParkUntil(t *testing.T) {
	now := time.Date(2026, 5, 12, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		reset    time.Time
		want     time.Time
		wantNote string
	}{
		{"reported", now.Add(3 * time.Hour), now.Add(3 * time.Hour), ""},
		{"weekly", now.Add(6 * 24 * time.Hour), now.Add(6 * 24 * time.Hour), ""},
		{"none", time.Time{}, now.Add(DefaultParkWait), "no reset time reported"},
		{"past", now.Add(-time.Hour), now.Add(MinParkWait), "has passed"},
		{"now", now, now.Add(MinParkWait), "has passed"},
		{"too_far", now.Add(400 * 24 * time.Hour), now.Add(DefaultParkWait), "more than"},
	} {
		got, note := ParkUntil(now, tc.reset)
		if !got.Equal(tc.want) || (tc.wantNote == "") != (note == "") || !strings.Contains(note, tc.wantNote) {
			t.Errorf("%s: ParkUntil = %s, %q; want %s, a note with %q", tc.name, got, note, tc.want, tc.wantNote)
		}
	}
	if !ReasonRateLimited.Parks() || ReasonEngineUnavailable.Parks() || ReasonRateLimited.Infrastructure() || ReasonRateLimited.Permanent() {
		t.Error("rate_limited parks; engine_unavailable does not; parking is neither an infrastructure failure nor permanent")
	}
	if !Retryable(ReasonRateLimited, 1000, Retry{Max: 0}) {
		t.Error("a parked job's retries are never spent")
	}
}

// TestWhatShipsReasonsAreNotRetried: a secret or a protected path in the
// change needs a person — a retry would resume from the same checkpoint
// and be refused again (#32).
func TestWhatShipsReasonsAreNotRetried(t *testing.T) {
	for _, r := range []Reason{ReasonSecretInChange, ReasonProtectedChange} {
		if !slices.Contains(Reasons, r) {
			t.Errorf("%s is not in Reasons", r)
		}
		if !r.Permanent() || r.Infrastructure() || r.Parks() || Retryable(r, 1, Retry{Max: 5}) {
			t.Errorf("%s: permanent %v, infrastructure %v, parks %v, retryable %v; want only permanent",
				r, r.Permanent(), r.Infrastructure(), r.Parks(), Retryable(r, 1, Retry{Max: 5}))
		}
	}
}
