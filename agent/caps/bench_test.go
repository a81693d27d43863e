package caps

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	git "github.com/go-git/go-git/v5"
)

// The repo detection benchmarks (#17 item 5, #19 item 3): what `aq caps` and
// a refresh pay to find the repositories under AQ_REPO_BASE, with 200 repos
// there, three ways side by side in one run — plain filesystem checks (what
// scanRepos does), go-git (PlainOpen per directory, and PlainOpen + HEAD
// resolved), and a git process per directory (`git rev-parse --git-dir`) —
// and what the per-heartbeat change check (one stat of the base) costs.
// docs/BENCHMARKS.md "#17/#19 detection" has the figures.

// benchRepos makes n real git repositories (one committed template, copied:
// each has its own .git with objects, refs and a HEAD) under a new base,
// plus a few directories that are not repositories.
func benchRepos(b *testing.B, n int) string {
	b.Helper()
	g := gitBin(b)
	root := b.TempDir()
	tmpl := filepath.Join(root, "template")
	runGit(b, g, "init", "-q", "-b", "main", tmpl)
	if err := os.WriteFile(filepath.Join(tmpl, "README.md"), []byte("hello\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	runGit(b, g, "-C", tmpl, "add", "README.md")
	runGit(b, g, "-C", tmpl, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "init")
	base := filepath.Join(root, "src")
	if err := os.MkdirAll(base, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		dst := filepath.Join(base, fmt.Sprintf("repo-%03d", i))
		if out, err := exec.Command("cp", "-a", tmpl, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
	}
	for i := range 5 {
		if err := os.MkdirAll(filepath.Join(base, fmt.Sprintf("not-a-repo-%d", i)), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	return base
}

// detectWith lists the repos under base, deciding each directory with is.
func detectWith(base string, is func(dir string) bool) ([]string, error) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() || e.Name()[0] == '.' {
			continue
		}
		if is(filepath.Join(base, e.Name())) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func BenchmarkRepoDetect(b *testing.B) {
	const n = 200
	base := benchRepos(b, n)
	g := gitBin(b)
	want, _, err := scanRepos(base)
	if err != nil || len(want) != n {
		b.Fatalf("scanRepos found %d (%v)", len(want), err)
	}
	ways := []struct {
		name string
		list func() ([]string, error)
	}{
		{"fs", func() ([]string, error) { r, _, err := scanRepos(base); return r, err }},
		{"gogit-open", func() ([]string, error) {
			return detectWith(base, func(dir string) bool { _, err := git.PlainOpen(dir); return err == nil })
		}},
		{"gogit-head", func() ([]string, error) {
			return detectWith(base, func(dir string) bool {
				r, err := git.PlainOpen(dir)
				if err != nil {
					return false
				}
				_, err = r.Head()
				return err == nil
			})
		}},
		{"git-process", func() ([]string, error) {
			return detectWith(base, func(dir string) bool {
				return exec.Command(g, "-C", dir, "rev-parse", "--git-dir").Run() == nil
			})
		}},
	}
	for _, w := range ways {
		b.Run(fmt.Sprintf("%drepos/%s", n, w.name), func(b *testing.B) {
			for b.Loop() {
				got, err := w.list()
				if err != nil || !slices.Equal(got, want) {
					b.Fatalf("%s found %d repos (%v), want %d", w.name, len(got), err, len(want))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/n, "µs/repo")
		})
	}
	// The per-heartbeat check: has the base changed since the last look?
	b.Run(fmt.Sprintf("%drepos/base-changed", n), func(b *testing.B) {
		s0, err := statBase(base)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			s, err := statBase(base)
			if err != nil || s != s0 {
				b.Fatal("the base changed")
			}
		}
	})
	// A whole detection as `aq caps` and a refresh run it: the repo scan,
	// the tool lookups, and version probes of three engines and node (fake
	// ones: /bin/sh scripts, far quicker than the real CLIs, which start a
	// Node runtime) — every time, and with the probe cache (binaries
	// unchanged: no process at all).
	bin := b.TempDir()
	for _, e := range []string{"claude", "codex", "devin", "node"} {
		writeExe(b, bin, e, `echo "`+e+` 1.2.3"`)
	}
	detect := func(b *testing.B, c *ProbeCache) {
		ctx := context.Background()
		for b.Loop() {
			h, err := Detect(ctx, DetectOptions{RepoBase: base, Path: bin, Cache: c})
			if err != nil || len(h.Repos) != n || len(h.Engines) != 4 {
				b.Fatal(err)
			}
		}
	}
	b.Run(fmt.Sprintf("%drepos/detect-probing", n), func(b *testing.B) { detect(b, nil) })
	b.Run(fmt.Sprintf("%drepos/detect-cached", n), func(b *testing.B) { detect(b, NewProbeCache()) })
}
