package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/internal/testenv"
)

// BenchmarkCapsRefresh is what keeping the offer current costs a factory
// with 200 repos under its base (#17 item 5): the check every heartbeat,
// poll tick and broker message makes when nothing changed (a stat of the
// base and of the directories that were no repository), and a check that
// finds the base changed and re-detects (the repo scan; version probes come
// from the probe cache). docs/BENCHMARKS.md "#17/#19 detection".
func BenchmarkCapsRefresh(b *testing.B) {
	const n = 200
	root := b.TempDir()
	tmpl := testenv.NewRepo(b, root, "template", nil)
	base := filepath.Join(root, "src")
	if err := os.MkdirAll(base, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		if out, err := exec.Command("cp", "-a", tmpl, filepath.Join(base, fmt.Sprintf("repo-%03d", i))).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
	}
	for i := range 5 { // directories that are no repository: checked each time
		if err := os.MkdirAll(filepath.Join(base, fmt.Sprintf("notes-%d", i)), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	cache := caps.NewProbeCache()
	detect := func(ctx context.Context) (*caps.Host, error) {
		return caps.Detect(ctx, caps.DetectOptions{RepoBase: base, Cache: cache})
	}
	c, err := NewClient(ClientOptions{API: "http://127.0.0.1:9/api"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	newRefresher := func() *Refresher {
		h, err := detect(ctx)
		if err != nil || len(h.Repos) != n {
			b.Fatalf("%v %d repos", err, len(h.Repos))
		}
		r := &Refresher{Client: c, Detect: detect, RepoBase: base, Every: time.Hour}
		r.Start(h)
		return r
	}
	b.Run(fmt.Sprintf("%drepos/check-unchanged", n), func(b *testing.B) {
		r := newRefresher()
		for b.Loop() {
			if r.Check(ctx) {
				b.Fatal("changed")
			}
		}
	})
	b.Run(fmt.Sprintf("%drepos/check-changed", n), func(b *testing.B) {
		r := newRefresher()
		extra := filepath.Join(base, "zz-extra")
		for i := 0; b.Loop(); i++ {
			// A new clone, or its removal: the offer changes every time.
			b.StopTimer()
			if i%2 == 0 {
				exec.Command("cp", "-a", tmpl, extra).Run()
			} else {
				os.RemoveAll(extra)
			}
			b.StartTimer()
			if !r.Check(ctx) {
				b.Fatal("the change was not seen")
			}
		}
	})
}
