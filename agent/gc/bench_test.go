package gc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// benchRefs is the size of the repository the benchmarks collect: 10,000
// aq/ branches.
const benchRefs = 10000

// benchSetup is a repository with benchRefs aq/ refs to delete, and a way
// to put them back before each iteration (packed-refs rewritten: creating
// 10,000 loose refs costs seconds on some file systems, and is not what is
// measured).
type benchSetup struct {
	f            *factory
	repo, origin string
	packed       []byte // the repository's packed-refs with every aq/ ref
	originPacked []byte
	recs         *jobstate.Store
}

func (s *benchSetup) reset(b *testing.B) {
	b.Helper()
	for _, x := range []struct {
		gitDir string
		packed []byte
	}{{filepath.Join(s.repo, ".git"), s.packed}, {s.origin, s.originPacked}} {
		if x.packed == nil {
			continue
		}
		os.RemoveAll(filepath.Join(x.gitDir, "refs", "heads", "aq"))
		os.RemoveAll(filepath.Join(x.gitDir, "refs", "remotes", "origin", "aq"))
		if err := os.WriteFile(filepath.Join(x.gitDir, "packed-refs"), x.packed, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// fastImport feeds a fast-import stream to repo and returns the marks
// (":n" → sha).
func fastImport(b *testing.B, repo, stream string) map[string]string {
	b.Helper()
	marks := filepath.Join(b.TempDir(), "marks")
	cmd := exec.Command("git", "fast-import", "--quiet", "--export-marks="+marks)
	cmd.Dir = repo
	cmd.Stdin = strings.NewReader(stream)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("fast-import: %v %s", err, out)
	}
	raw, err := os.ReadFile(marks)
	if err != nil {
		b.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			m[k] = v
		}
	}
	return m
}

// newBenchSetup builds the repository. squash: benchRefs job branches of
// one commit each, every one squash-merged into main (main has a commit
// with the same change after the branch's parent). Otherwise: benchRefs/2
// shipped jobs, each with a job branch merged into main and a WIP ref of its
// own. withOrigin: origin has every aq/ ref too.
func newBenchSetup(b *testing.B, squash, withOrigin bool) *benchSetup {
	b.Helper()
	f := newFactory(b)
	repo := f.repoDir("big")
	testenv.Git(b, "", "init", "-q", "-b", "main", repo)
	var st strings.Builder
	mark := 0
	next := func() int { mark++; return mark }
	when := time.Now().Add(-30 * 24 * time.Hour).Unix()
	commit := func(parent int, file, content string) int {
		m := next()
		when++
		fmt.Fprintf(&st, "commit refs/heads/scratch\nmark :%d\ncommitter T <t@e> %d +0000\ndata 2\nc\n", m, when)
		if parent > 0 {
			fmt.Fprintf(&st, "from :%d\n", parent)
		}
		fmt.Fprintf(&st, "M 644 inline %s\ndata %d\n%s\n", file, len(content), content)
		return m
	}
	var refs []worktree.Ref
	main := commit(0, "README.md", "# big\n")
	var jobs []int
	if squash {
		var branches []int
		for i := range benchRefs {
			f := fmt.Sprintf("pkg%03d/sq/%02d.txt", i/100, i%100) // nested, as real trees are
			c := fmt.Sprintf("change %d\n", i)
			branches = append(branches, commit(main, f, c))
			main = commit(main, f, c) // the squash merge
		}
		marks := fastImport(b, repo, st.String())
		for i, br := range branches {
			refs = append(refs, worktree.Ref{Name: fmt.Sprintf("refs/heads/aq/job/q%05d", i), SHA: marks[fmt.Sprint(":", br)]})
			jobs = append(jobs, i)
		}
		refs = append(refs, worktree.Ref{Name: "refs/heads/main", SHA: marks[fmt.Sprint(":", main)]})
	} else {
		var history []int
		for i := range 200 {
			main = commit(main, fmt.Sprintf("src/%03d.go", i), fmt.Sprintf("package src // %d\n", i))
			history = append(history, main)
		}
		var wips []int
		for i := range benchRefs / 2 {
			wips = append(wips, commit(history[i%len(history)], fmt.Sprintf("wip/%03d/%02d.txt", i/100, i%100), fmt.Sprintf("wip %d\n", i)))
		}
		marks := fastImport(b, repo, st.String())
		for i := range benchRefs / 2 {
			refs = append(refs,
				worktree.Ref{Name: fmt.Sprintf("refs/heads/aq/job/j%05d", i), SHA: marks[fmt.Sprint(":", history[i%len(history)])]},
				worktree.Ref{Name: fmt.Sprintf("refs/heads/aq/wip/j%05d", i), SHA: marks[fmt.Sprint(":", wips[i])]})
			jobs = append(jobs, i)
		}
		refs = append(refs, worktree.Ref{Name: "refs/heads/main", SHA: marks[fmt.Sprint(":", main)]})
	}
	testenv.Git(b, repo, "update-ref", "-d", "refs/heads/scratch")
	testenv.Git(b, repo, "symbolic-ref", "HEAD", "refs/heads/main")
	var packed bytes.Buffer
	packed.WriteString("# pack-refs with: peeled fully-peeled \n")
	for _, r := range refs {
		fmt.Fprintf(&packed, "%s %s\n", r.SHA, r.Name)
	}
	s := &benchSetup{f: f, repo: repo, packed: packed.Bytes()}
	os.Remove(filepath.Join(repo, ".git", "refs", "heads", "main"))
	s.reset(b)
	testenv.Git(b, repo, "reset", "-q", "--hard", "main")

	recs, err := jobstate.Open(filepath.Join(f.home, "state", "jobs"))
	if err != nil {
		b.Fatal(err)
	}
	prefix := "j"
	if squash {
		prefix = "q"
	}
	for _, i := range jobs {
		if err := recs.Put(jobstate.Record{ID: fmt.Sprintf("%s%05d", prefix, i), Repo: "big", Base: "main", Stage: job.Shipped,
			EndedAt: time.Now().Add(-time.Hour), UpdatedAt: time.Now()}); err != nil {
			b.Fatal(err)
		}
	}
	s.recs = recs
	if withOrigin {
		s.origin = f.originDir("big")
		testenv.Git(b, "", "clone", "-q", "--bare", repo, s.origin)
		testenv.Git(b, repo, "remote", "add", "origin", s.origin)
		s.originPacked = slices.Clone(packed.Bytes())
		s.reset(b)
	}
	return s
}

// BenchmarkGC10000Branches: `aq gc` on a repository with 10,000 aq/
// branches, every one of them deletable, against the floor of the raw git
// commands that do the same deletions:
//
//   - local: 5,000 shipped jobs, each with a merged job branch and a WIP
//     ref; no origin. Floor: for-each-ref (list), for-each-ref --merged
//     (ancestry), update-ref --stdin (10,000 compare-and-swap deletes, in
//     transactions of 1,000).
//   - origin: the same, and origin holds every ref too. Floor adds
//     ls-remote and atomic pushes of 1,000 ":ref" deletes with a lease each.
//   - squash: 10,000 one-commit job branches, each squash-merged into main
//     (none is an ancestor). Floor as local: it does not detect squash
//     merges at all, so the difference is what detection costs.
func BenchmarkGC10000Branches(b *testing.B) {
	for _, c := range []struct {
		name           string
		squash, origin bool
	}{{"local", false, false}, {"origin", false, true}, {"squash", true, false}} {
		b.Run("aq/"+c.name, func(b *testing.B) {
			s := newBenchSetup(b, c.squash, c.origin)
			g := s.f.gc(func(g *GC) { g.Records = s.recs; g.Cfg.Offline = !c.origin })
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				s.reset(b)
				b.StartTimer()
				rep, err := g.Run(ctx, false)
				if err != nil {
					b.Fatal(err)
				}
				want := benchRefs
				if c.origin {
					want *= 2
				}
				if n := rep.Deleted.Total(); n != want || len(rep.Errors) != 0 {
					b.Fatalf("deleted %+v (%d, want %d), errors %v", rep.Deleted, n, want, rep.Errors)
				}
			}
		})
		b.Run("floor/"+c.name, func(b *testing.B) {
			s := newBenchSetup(b, c.squash, c.origin)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				s.reset(b)
				b.StartTimer()
				floor(b, s.repo, c.origin)
			}
		})
	}
}

// floor deletes every aq/ ref with plain git, batched as aq batches: list,
// check ancestry, delete in update-ref transactions of 1,000 (one
// transaction of 10,000 is slower: its lock files pile up in two
// directories), and on origin in atomic pushes of 1,000 leases.
func floor(b *testing.B, repo string, origin bool) {
	list := testenv.Git(b, repo, "for-each-ref", "--format=%(objectname) %(committerdate:unix) %(refname)", "refs/heads/aq/")
	testenv.Git(b, repo, "for-each-ref", "--merged=main", "--format=%(refname)", "refs/heads/aq/")
	var refs []worktree.Ref
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		refs = append(refs, worktree.Ref{Name: f[2], SHA: f[0]})
	}
	for i := 0; i < len(refs); i += 1000 {
		var in strings.Builder
		for _, r := range refs[i:min(i+1000, len(refs))] {
			fmt.Fprintf(&in, "delete %s %s\n", r.Name, r.SHA)
		}
		cmd := exec.Command("git", "update-ref", "--stdin")
		cmd.Dir = repo
		cmd.Stdin = strings.NewReader(in.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("update-ref: %v %s", err, out)
		}
	}
	if !origin {
		return
	}
	testenv.Git(b, repo, "ls-remote", "origin", "refs/heads/aq/*")
	for i := 0; i < len(refs); i += 1000 {
		args := []string{"push", "--atomic", "--porcelain", "--no-verify"}
		chunk := refs[i:min(i+1000, len(refs))]
		for _, r := range chunk {
			args = append(args, "--force-with-lease="+r.Name+":"+r.SHA)
		}
		args = append(args, "origin")
		for _, r := range chunk {
			args = append(args, ":"+r.Name)
		}
		testenv.Git(b, repo, args...)
	}
}
