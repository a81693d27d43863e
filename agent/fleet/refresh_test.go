package fleet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestRefresherFollowsTheRepoBase: with a long cadence, the repo base
// changing is what triggers a detection — a new repository (also one whose
// clone was still in progress at the last look), a removed one — and the
// client's offer (what the next heartbeat and claim carry) follows; a
// check with nothing changed runs no detection; a broken .git never makes
// every check detect; a failing detection keeps the offer; Every 0 is off.
func TestRefresherFollowsTheRepoBase(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	base := filepath.Join(t.TempDir(), "src")
	testenv.NewRepo(t, base, "app", nil)
	var detections atomic.Int32
	var fail atomic.Bool
	detect := func(ctx context.Context) (*caps.Host, error) {
		detections.Add(1)
		if fail.Load() {
			return nil, errors.New("repo base unreadable")
		}
		return caps.Detect(ctx, caps.DetectOptions{RepoBase: base, Path: "/nonexistent", Tools: []string{}})
	}
	c, err := NewClient(ClientOptions{API: "http://127.0.0.1:9/api"})
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	r := &Refresher{Client: c, Detect: detect, RepoBase: base, Every: time.Hour, Changed: func() { changed++ }}
	h, _ := detect(context.Background())
	c.SetOffer(h.Tokens(), h.Repos)
	r.Start(h)
	ctx := context.Background()
	repos := func() []string { _, rs := c.Offer(); return rs }

	// Nothing changed: a stat, no detection.
	n0 := detections.Load()
	for range 5 {
		if r.Check(ctx) {
			t.Fatal("a change without one")
		}
	}
	if detections.Load() != n0 {
		t.Fatalf("%d detections without a change", detections.Load()-n0)
	}
	// A new clone.
	testenv.NewRepo(t, base, "lib", nil)
	if !r.Check(ctx) || !slices.Equal(repos(), []string{"app", "lib"}) || changed != 1 {
		t.Fatalf("after a clone: %v (changed %d)", repos(), changed)
	}
	capsNow, _ := c.Offer()
	if !slices.Contains(capsNow, "repo:lib") {
		t.Fatalf("capabilities %v", capsNow)
	}
	// A clone in progress: its directory first (the base's mtime moves),
	// its .git later (only the directory's own mtime moves).
	inProgress := filepath.Join(base, "web")
	if err := os.Mkdir(inProgress, 0o755); err != nil {
		t.Fatal(err)
	}
	if r.Check(ctx) { // detected: no repository yet
		t.Fatal("an empty directory changed the offer")
	}
	testenv.Git(t, inProgress, "init", "-q")
	if !r.Check(ctx) || !slices.Contains(repos(), "web") {
		t.Fatalf("the finished clone was not seen: %v", repos())
	}
	// A directory with a broken .git is pending for good: it must not make
	// every check detect.
	broken := filepath.Join(base, "broken")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(broken, ".git"), "not a link\n")
	r.Check(ctx)
	n1 := detections.Load()
	for range 3 {
		r.Check(ctx)
	}
	if detections.Load() != n1 {
		t.Fatal("a broken .git made every check detect")
	}
	// A removed repository, then Lost and Unfit say so.
	if err := os.RemoveAll(filepath.Join(base, "lib")); err != nil {
		t.Fatal(err)
	}
	if why := r.Unfit(ctx, []string{"os:" + h.OS}, "lib"); !strings.Contains(why, "repo:lib") {
		t.Fatalf("unfit %q (repos %v)", why, repos())
	}
	if slices.Contains(repos(), "lib") || !r.Lost("repo:lib") || r.Lost("repo:app") {
		t.Fatalf("after the removal: %v", repos())
	}
	if why := r.Unfit(ctx, []string{"has:nothing-like-it"}, "app"); !strings.Contains(why, "has:nothing-like-it") {
		t.Fatalf("a declared capability this host lacks: %q", why)
	}
	if why := r.Unfit(ctx, nil, "never-here"); why != "" {
		t.Fatalf("a repo never offered (it may be cloned from a URL): %q", why)
	}
	// A failing detection keeps the offer (said once).
	fail.Store(true)
	testenv.NewRepo(t, base, "docs", nil)
	if r.Check(ctx) || !slices.Equal(repos(), []string{"app", "web"}) {
		t.Fatalf("a failed detection changed the offer: %v", repos())
	}
	n3 := detections.Load()
	r.Check(ctx)
	if detections.Load() != n3 {
		t.Fatal("a failed detection is retried at every check")
	}
	fail.Store(false)
	// The cadence: due, it detects without a change of the base.
	r.Every = time.Nanosecond
	if !r.Check(ctx) || !slices.Contains(repos(), "docs") {
		t.Fatalf("cadence: %v", repos())
	}
	// Off.
	r.Every = 0
	testenv.NewRepo(t, base, "more", nil)
	n2 := detections.Load()
	if r.Check(ctx) || detections.Load() != n2 {
		t.Fatal("AQ_CAPS_REFRESH=0 refreshed")
	}
}
