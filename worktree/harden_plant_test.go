//go:build unix

package worktree

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// plantFixture is a repository with an origin and a job's linked worktree,
// and a marker program: every plant runs it, and it records that it ran.
type plantFixture struct {
	repo, origin, wt string
	marker           string // the program a plant names
	marks            string // the file it appends its name and arguments to
	g                Git
}

func newPlantFixture(t *testing.T) *plantFixture {
	t.Helper()
	// As aq's own clones are: blobless, so that checkouts in the job's
	// worktree fetch blobs from origin as they go (lazy fetches).
	seed, origin := newRepoWithOrigin(t)
	testenv.Git(t, origin, "config", "uploadpack.allowFilter", "true")
	repo := filepath.Join(t.TempDir(), "repo")
	testenv.Git(t, "", "clone", "-q", "--filter=blob:none", "file://"+origin, repo)
	f := &plantFixture{repo: repo, origin: origin, g: Git{ConfigDir: t.TempDir()}}
	f.wt = addWorktree(t, repo, "job", "main")
	// Someone else changes origin's main meanwhile, README.md included:
	// the job's fetch brings commits whose blobs are fetched later, and
	// gc's merge-tree of the job against it merges README.md.
	testenv.WriteFile(t, filepath.Join(seed, "README.md"), "# repo, upstream\n")
	testenv.WriteFile(t, filepath.Join(seed, "upstream.txt"), "new upstream\n")
	testenv.Git(t, seed, "add", "-A")
	testenv.Git(t, seed, "commit", "-qm", "upstream")
	testenv.Git(t, seed, "push", "-q", "origin", "main")
	dir := t.TempDir()
	f.marks = filepath.Join(dir, "marks")
	f.marker = filepath.Join(dir, "marker")
	// It reads nothing and says nothing: a filter or a transport that
	// waits for it fails, which is fine — it ran.
	testenv.WriteFile(t, f.marker, fmt.Sprintf("#!/bin/sh\necho \"$0 $*\" >> '%s'\nexit 0\n", f.marks))
	if err := os.Chmod(f.marker, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

// ran says what the marker recorded ("" when it never ran) and forgets it.
func (f *plantFixture) ran() string {
	b, _ := os.ReadFile(f.marks)
	os.Remove(f.marks)
	return strings.TrimSpace(string(b))
}

// plainGit runs the git a person would, in dir, with env added ("KEY="
// unsets KEY): the control that shows a plant is live.
func (f *plantFixture) plainGit(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	// "KEY=" in env unsets KEY.
	for _, kv := range append(os.Environ(), testenv.Identity...) {
		if k, _, _ := strings.Cut(kv, "="); !slices.Contains(env, k+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, kv := range env {
		if !strings.HasSuffix(kv, "=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Run() // a plant may well make it fail: what matters is what ran
}

// where a key is planted: the repository's common config, the worktree's
// own config, a file the common config includes, or a file included only
// on the job's branches.
type where string

const (
	inCommon   where = "common"
	inWorktree where = "config.worktree"
	inInclude  where = "include"
	inOnBranch where = "includeIf onbranch"
)

func (f *plantFixture) plant(t *testing.T, w where, key, value string) {
	t.Helper()
	common := filepath.Join(f.repo, ".git")
	switch w {
	case inCommon:
		testenv.Git(t, f.repo, "config", "--add", key, value)
	case inWorktree:
		testenv.Git(t, f.repo, "config", "extensions.worktreeConfig", "true")
		testenv.Git(t, f.wt, "config", "--worktree", "--add", key, value)
	case inInclude:
		testenv.Git(t, "", "config", "-f", filepath.Join(common, "planted.cfg"), "--add", key, value)
		testenv.Git(t, f.repo, "config", "include.path", "planted.cfg")
	case inOnBranch:
		testenv.Git(t, "", "config", "-f", filepath.Join(common, "onbranch.cfg"), "--add", key, value)
		testenv.Git(t, f.repo, "config", "includeIf.onbranch:aq/**.path", "onbranch.cfg")
	}
}

// lifecycle is what aq does with a job's repository, worktree and origin:
// the engine's work checkpointed (periodically and at the end), the
// result committed and squashed, its diffstat, pushes (WIP with a lease,
// the branch), a fetch of origin's main, the worktree reset to it for the
// next job (which fetches the blobs it lacks), remote lookups, gc's
// queries, merge-tree of the job against origin's main, a deletion on
// origin, a new worktree added and removed. Every step must succeed.
func (f *plantFixture) lifecycle(t *testing.T, files map[string]string) {
	t.Helper()
	ctx := ctxT(t)
	g := f.g
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	base := testenv.Git(t, f.repo, "rev-parse", "main")
	for p, c := range files {
		testenv.WriteFile(t, filepath.Join(f.wt, p), c)
	}
	testenv.WriteFile(t, filepath.Join(f.wt, "work.txt"), "the engine's work\n")
	testenv.WriteFile(t, filepath.Join(f.wt, "README.md"), "# repo, the job's\n")
	cp := &Checkpointer{Git: g, Path: f.wt, Watch: true, SmallIndex: -1}
	defer cp.Close()
	_, err := cp.Checkpoint(ctx, "aq/wip/job", "periodic")
	must("periodic checkpoint", err)
	testenv.WriteFile(t, filepath.Join(f.wt, "more.txt"), "more\n")
	_, err = cp.Checkpoint(ctx, "aq/wip/job", "periodic")
	must("second periodic checkpoint", err)
	wip, err := Checkpoint(ctx, g, f.wt, "aq/wip/job", "final")
	must("final checkpoint", err)
	_, err = Dirty(ctx, g, f.wt)
	must("dirty", err)
	_, _, err = CommitAll(ctx, g, f.wt, "the job's result")
	must("commit", err)
	tip, _, err := SquashOnto(ctx, g, f.wt, base, "the job's result, squashed")
	must("squash", err)
	_, _, _, err = DiffStat(ctx, g, f.wt, base, tip)
	must("diffstat", err)
	must("push WIP", PushWithLease(ctx, g, f.repo, "origin", "aq/wip/job", "aq/wip/job", ""))
	must("push branch", Push(ctx, g, f.repo, "origin", "aq/job/job"))
	must("fetch", Fetch(ctx, g, f.repo, "origin", "+refs/heads/main:refs/remotes/origin/main"))
	upstream := testenv.Git(t, f.repo, "rev-parse", "refs/remotes/origin/main")
	// The worktree pooled and reset for the next job, on origin's main: its
	// checkout fetches the blobs it lacks, in the worktree.
	must("reset for the next job", Reset(ctx, g, f.wt, "aq/job/next", upstream))
	if got := testenv.ReadFile(t, filepath.Join(f.wt, "upstream.txt")); got != "new upstream\n" {
		t.Fatalf("after the reset, upstream.txt = %q", got)
	}
	if sha, ok, err := RemoteRef(ctx, g, f.repo, "origin", "aq/job/job"); err != nil || !ok || sha != tip {
		t.Fatalf("remote ref: %s %v %v, want %s", sha, ok, err, tip)
	}
	remote, err := ListRemoteRefs(ctx, g, f.repo, "origin", "refs/heads/aq/*")
	must("ls-remote", err)
	_, err = ListRefInfo(ctx, g, f.repo, "refs/heads/aq/")
	must("for-each-ref", err)
	_, err = MergedInto(ctx, g, f.repo, "refs/remotes/origin/main", "refs/heads/aq/")
	must("merged", err)
	_, err = SquashMerged(ctx, g, f.repo, []string{upstream}, []string{tip, wip}, SquashOptions{})
	must("squash-merged (merge-tree)", err)
	var wipRef []Ref
	for _, r := range remote {
		if r.Name == "refs/heads/aq/wip/job" {
			wipRef = append(wipRef, r)
		}
	}
	if len(wipRef) != 1 {
		t.Fatalf("origin's aq refs: %v, want aq/wip/job among them", remote)
	}
	res, err := DeleteRemoteRefs(ctx, g, f.repo, "origin", wipRef)
	must("delete remote refs", err)
	if res[0].Outcome != RefDeleted {
		t.Fatalf("delete remote ref: %+v", res[0])
	}
	other := filepath.Join(filepath.Dir(f.wt), "other")
	must("add a worktree", Add(ctx, g, f.repo, other, "aq/job/other", "refs/remotes/origin/main"))
	must("remove it", Remove(ctx, g, f.repo, other))
	must("prune", Prune(ctx, g, f.repo))
}

// TestAqGitRunsNothingPlanted plants, one at a time and in each place a
// repository's configuration comes from, everything that makes git run a
// program; shows the plant is live (a plain git runs it); and shows that
// aq's git — a job's whole lifecycle through this package — runs none of
// it, and that every step still succeeds. (Diff drivers and editors were
// kept out before the hardening too — aq's diffs pass --no-ext-diff and
// --no-textconv, its environment sets GIT_EDITOR=: — and are pinned as
// well.)
func TestAqGitRunsNothingPlanted(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	// What each plant needs the engine to have written in the worktree:
	// attributes that name the drivers.
	drivers := map[string]string{".gitattributes": "* filter=planted diff=planted merge=planted\n"}
	type plantCase struct {
		name    string
		key     string
		value   func(f *plantFixture) string
		files   map[string]string
		wheres  []where
		control func(t *testing.T, f *plantFixture) // plain git that runs it
		// aq is what aq does instead of the whole lifecycle, for a plant
		// that makes it fail by design.
		aq func(t *testing.T, f *plantFixture)
	}
	// Every place for a few keys (the places work the same for all).
	all := []where{inCommon, inWorktree, inInclude, inOnBranch}
	common := []where{inCommon}
	marker := func(f *plantFixture) string { return f.marker }
	status := func(t *testing.T, f *plantFixture) { f.plainGit(t, f.wt, nil, "status") }
	add := func(t *testing.T, f *plantFixture) {
		testenv.WriteFile(t, filepath.Join(f.wt, "new.txt"), "x\n")
		f.plainGit(t, f.wt, nil, "add", "-A")
	}
	// In the worktree: it sees every place a plant can be.
	fetch := func(t *testing.T, f *plantFixture) { f.plainGit(t, f.wt, nil, "fetch", "origin") }
	push := func(t *testing.T, f *plantFixture) {
		f.plainGit(t, f.wt, nil, "push", "origin", "main:refs/heads/control")
	}
	cases := []plantCase{
		{"fsmonitor", "core.fsmonitor", marker, nil, all, status, nil},
		{"hooksPath", "core.hooksPath", func(f *plantFixture) string { return hookDir(t, f) }, nil, common,
			func(t *testing.T, f *plantFixture) { f.plainGit(t, f.wt, nil, "commit", "--allow-empty", "-m", "x") }, nil},
		{"clean filter", "filter.planted.clean", marker, drivers, all, add, nil},
		{"smudge filter", "filter.planted.smudge", marker, drivers, common, func(t *testing.T, f *plantFixture) {
			add(t, f)
			f.plainGit(t, f.wt, nil, "commit", "-qm", "x")
			os.Remove(filepath.Join(f.wt, "new.txt"))
			f.plainGit(t, f.wt, nil, "checkout", "--", "new.txt")
		}, nil},
		{"process filter", "filter.planted.process", marker, drivers, common, add, nil},
		{"required filter", "filter.planted.required", func(*plantFixture) string { return "true" }, drivers, common, nil, nil},
		{"textconv", "diff.planted.textconv", marker, drivers, common, func(t *testing.T, f *plantFixture) {
			testenv.WriteFile(t, filepath.Join(f.wt, "README.md"), "changed\n")
			f.plainGit(t, f.wt, nil, "diff")
		}, nil},
		{"external diff driver", "diff.planted.command", marker, drivers, common, func(t *testing.T, f *plantFixture) {
			testenv.WriteFile(t, filepath.Join(f.wt, "README.md"), "changed\n")
			f.plainGit(t, f.wt, nil, "diff")
		}, nil},
		{"diff.external", "diff.external", marker, nil, common, func(t *testing.T, f *plantFixture) {
			testenv.WriteFile(t, filepath.Join(f.wt, "README.md"), "changed\n")
			f.plainGit(t, f.wt, nil, "diff")
		}, nil},
		{"merge driver", "merge.planted.driver", marker, drivers, common, func(t *testing.T, f *plantFixture) {
			testenv.WriteFile(t, filepath.Join(f.wt, "README.md"), "ours\n")
			f.plainGit(t, f.wt, nil, "commit", "-qam", "ours")
			f.plainGit(t, f.repo, nil, "commit", "-qm", "theirs", "--allow-empty")
			testenv.WriteFile(t, filepath.Join(f.repo, "README.md"), "theirs\n")
			f.plainGit(t, f.repo, nil, "commit", "-qam", "theirs")
			f.plainGit(t, f.repo, nil, "merge-tree", "--write-tree", "main", "aq/job/job")
		}, nil},
		{"receive-pack", "remote.origin.receivepack", marker, nil, common, push, nil},
		{"upload-pack", "remote.origin.uploadpack", marker, nil, all, fetch, nil},
		{"alternate refs command", "core.alternateRefsCommand", marker, nil, common, func(t *testing.T, f *plantFixture) {
			alternates(t, f)
			fetch(t, f)
		}, nil},
		{"editor", "core.editor", marker, nil, common, func(t *testing.T, f *plantFixture) {
			f.plainGit(t, f.wt, []string{"GIT_EDITOR=", "EDITOR=", "VISUAL="}, "commit", "--allow-empty")
		}, nil},
		{"sequence editor", "sequence.editor", marker, nil, common, func(t *testing.T, f *plantFixture) {
			f.plainGit(t, f.wt, nil, "rebase", "-i", "HEAD")
		}, nil},
		// With commit.gpgSign planted too, aq's commit is signed by the
		// trusted gpg (which has no key here: the commit fails).
		{"gpg program", "gpg.program", marker, nil, common, func(t *testing.T, f *plantFixture) {
			f.plainGit(t, f.wt, nil, "commit", "--allow-empty", "-m", "signed")
		}, func(t *testing.T, f *plantFixture) {
			testenv.WriteFile(t, filepath.Join(f.wt, "work.txt"), "work\n")
			CommitAll(ctxT(t), f.g, f.wt, "the job's result")
		}},
	}
	for _, c := range cases {
		for _, w := range c.wheres {
			t.Run(c.name+" in "+string(w), func(t *testing.T) {
				t.Parallel()
				if w != inCommon {
					// Every key is planted in the common config under -short;
					// the other places work the same for every key.
					testenv.Slow(t, "a plant in another place than the common config")
				}
				f := newPlantFixture(t)
				plantAttributes(t, f, c.files)
				extra := func(f *plantFixture) {
					switch c.name {
					case "required filter":
						f.plant(t, w, "filter.planted.clean", f.marker)
					case "gpg program":
						f.plant(t, w, "commit.gpgSign", "true")
					}
				}
				extra(f)
				if c.name == "alternate refs command" {
					alternates(t, f)
				}
				f.plant(t, w, c.key, c.value(f))
				if c.control != nil {
					// The control runs on the job's branch (onbranch: plants).
					c.control(t, f)
					if f.ran() == "" {
						t.Fatalf("plain git did not run the planted %s: the test proves nothing", c.key)
					}
					// The control may have changed the fixture: start again.
					f = newPlantFixture(t)
					plantAttributes(t, f, c.files)
					if c.name == "alternate refs command" {
						alternates(t, f)
					}
					extra(f)
					f.plant(t, w, c.key, c.value(f))
				}
				if c.aq != nil {
					c.aq(t, f)
				} else {
					f.lifecycle(t, c.files)
				}
				if ran := f.ran(); ran != "" {
					t.Errorf("aq's git ran the planted %s (%s): %s", c.key, w, ran)
				}
			})
		}
	}
}

// plantAttributes writes attributes that name the planted drivers where
// they count for every command: the repository's info/attributes (the
// engine writes the same in .gitattributes in the lifecycle).
func plantAttributes(t *testing.T, f *plantFixture, files map[string]string) {
	if c, ok := files[".gitattributes"]; ok {
		testenv.WriteFile(t, filepath.Join(f.repo, ".git", "info", "attributes"), c)
	}
}

// hookDir is a folder of every hook aq's commands could run, each the
// marker.
func hookDir(t *testing.T, f *plantFixture) string {
	dir := filepath.Join(t.TempDir(), "hooks")
	for _, h := range hookNames {
		testenv.WriteFile(t, filepath.Join(dir, h), "#!/bin/sh\nexec '"+f.marker+"' "+h+" \"$@\"\n")
		os.Chmod(filepath.Join(dir, h), 0o755)
	}
	return dir
}

var hookNames = []string{"pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout", "post-merge",
	"pre-push", "reference-transaction", "post-index-change", "pre-auto-gc", "post-rewrite", "push-to-checkout"}

// alternates makes the repository borrow the origin's objects, as aq's
// clones borrow a mirror's: git then asks core.alternateRefsCommand.
func alternates(t *testing.T, f *plantFixture) {
	testenv.WriteFile(t, filepath.Join(f.repo, ".git", "objects", "info", "alternates"), filepath.Join(f.origin, "objects")+"\n")
}

// TestAqGitRunsNoPlantedHook: hooks planted as files in the repository's
// hooks folder (what `git lfs install` or a person would put there, and
// what an engine could) do not run for aq; a plain git runs them.
func TestAqGitRunsNoPlantedHook(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	f := newPlantFixture(t)
	for _, h := range hookNames {
		p := filepath.Join(f.repo, ".git", "hooks", h)
		testenv.WriteFile(t, p, "#!/bin/sh\nexec '"+f.marker+"' "+h+" \"$@\"\n")
		os.Chmod(p, 0o755)
	}
	f.plainGit(t, f.wt, nil, "commit", "--allow-empty", "-m", "x")
	if f.ran() == "" {
		t.Fatal("plain git ran no planted hook: the test proves nothing")
	}
	f.lifecycle(t, nil)
	if ran := f.ran(); ran != "" {
		t.Errorf("aq's git ran planted hooks:\n%s", ran)
	}
}

// TestAqGitRedirectsNothing: a repository's url.*.insteadOf and
// pushInsteadOf, which would send aq's pushes and fetches to another
// repository, and core.worktree, which would make aq checkpoint another
// folder, change nothing for aq.
func TestAqGitRedirectsNothing(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	for _, variable := range []string{"insteadOf", "pushInsteadOf"} {
		for _, w := range []where{inCommon, inInclude} {
			t.Run(variable+" in "+string(w), func(t *testing.T) {
				t.Parallel()
				f := newPlantFixture(t)
				evil := filepath.Join(t.TempDir(), "evil.git")
				testenv.Git(t, "", "init", "-q", "--bare", evil)
				f.plant(t, w, "url."+evil+"."+variable, "file://"+f.origin)
				f.plainGit(t, f.repo, nil, "push", "origin", "main:refs/heads/control")
				if testenv.RemoteRefs(t, evil, "refs/heads/")["refs/heads/control"] == "" {
					t.Fatal("plain git did not push to the rewritten URL: the test proves nothing")
				}
				f.lifecycle(t, nil)
				if refs := testenv.RemoteRefs(t, evil, "refs/heads/aq/"); len(refs) != 0 {
					t.Errorf("aq pushed to the rewritten URL: %v", refs)
				}
				if testenv.RemoteRefs(t, f.origin, "refs/heads/")["refs/heads/aq/job/job"] == "" {
					t.Error("aq's push did not reach origin")
				}
			})
		}
	}
	t.Run("core.worktree", func(t *testing.T) {
		t.Parallel()
		f := newPlantFixture(t)
		elsewhere := t.TempDir()
		testenv.WriteFile(t, filepath.Join(elsewhere, "secret.txt"), "not the job's\n")
		f.plant(t, inWorktree, "core.worktree", elsewhere)
		cmd := exec.Command("git", "status", "--porcelain")
		cmd.Dir = f.wt
		if out, _ := cmd.Output(); !strings.Contains(string(out), "secret.txt") {
			t.Fatalf("plain git does not see the other folder (%q): the test proves nothing", out)
		}
		testenv.WriteFile(t, filepath.Join(f.wt, "work.txt"), "work\n")
		sha, err := Checkpoint(ctxT(t), f.g, f.wt, "aq/wip/job", "final")
		if err != nil {
			t.Fatal(err)
		}
		files := testenv.TreeFiles(t, f.repo, sha)
		if _, ok := files["secret.txt"]; ok {
			t.Errorf("aq checkpointed the folder core.worktree points at: %v", files)
		}
		if _, ok := files["work.txt"]; !ok {
			t.Errorf("aq's checkpoint lacks the worktree's own file: %v", files)
		}
	})
}

// TestAqGitNetworkPlants: what a repository can name for reaching a
// remote — credential helpers, an askpass program, an ssh command, a
// git:// proxy command, a remote helper, the ext:: transport, an HTTP
// proxy — runs (or is used) for a plain git and not for aq's, whose
// attempt fails without it. A credential helper the operator configured
// (global) still runs.
func TestAqGitNetworkPlants(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	var unauthorized, proxied atomic.Int32
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unauthorized.Add(1)
		w.Header().Set("WWW-Authenticate", `Basic realm="aq-test"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer web.Close()
	evilProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer evilProxy.Close()
	helpers := t.TempDir()
	type netCase struct {
		name   string
		remote string
		plants func(f *plantFixture) [][2]string
		env    []string
		used   func() bool // besides the marker: was the plant used?
	}
	cases := []netCase{
		{"credential helper", web.URL + "/r.git", func(f *plantFixture) [][2]string {
			return [][2]string{{"credential.helper", f.marker}}
		}, nil, nil},
		{"credential helper for the URL", web.URL + "/r.git", func(f *plantFixture) [][2]string {
			return [][2]string{{"credential." + web.URL + ".helper", f.marker}}
		}, nil, nil},
		{"askpass", web.URL + "/r.git", func(f *plantFixture) [][2]string {
			return [][2]string{{"core.askPass", f.marker}}
		}, nil, nil},
		{"ssh command", "ssh://127.0.0.1:1/r.git", func(f *plantFixture) [][2]string {
			return [][2]string{{"core.sshCommand", f.marker}}
		}, nil, nil},
		{"git proxy", "git://127.0.0.1:1/r.git", func(f *plantFixture) [][2]string {
			return [][2]string{{"core.gitProxy", f.marker}}
		}, nil, nil},
		{"remote helper", "planted::somewhere", func(f *plantFixture) [][2]string {
			testenv.WriteFile(t, filepath.Join(helpers, "git-remote-planted"), "#!/bin/sh\nexec '"+f.marker+"' remote-helper \"$@\"\n")
			os.Chmod(filepath.Join(helpers, "git-remote-planted"), 0o755)
			return nil
		}, []string{"PATH=" + helpers + ":" + os.Getenv("PATH")}, nil},
		{"remote vcs", "somewhere", func(f *plantFixture) [][2]string {
			testenv.WriteFile(t, filepath.Join(helpers, "git-remote-planted"), "#!/bin/sh\nexec '"+f.marker+"' remote-helper \"$@\"\n")
			os.Chmod(filepath.Join(helpers, "git-remote-planted"), 0o755)
			return [][2]string{{"remote.planted.vcs", "planted"}}
		}, []string{"PATH=" + helpers + ":" + os.Getenv("PATH")}, nil},
		{"ext transport", "ext::" + "MARKER %S", func(f *plantFixture) [][2]string {
			return [][2]string{{"protocol.ext.allow", "always"}}
		}, nil, nil},
		{"http proxy", web.URL + "/r.git", func(f *plantFixture) [][2]string {
			return [][2]string{{"http.proxy", evilProxy.URL}}
		}, nil, func() bool { return proxied.Load() > 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPlantFixture(t)
			url := strings.ReplaceAll(c.remote, "MARKER", f.marker)
			testenv.Git(t, f.repo, "remote", "add", "planted", url)
			for _, kv := range c.plants(f) {
				testenv.Git(t, f.repo, "config", "--add", kv[0], kv[1])
			}
			proxied.Store(0)
			f.plainGit(t, f.repo, append([]string{"GIT_TERMINAL_PROMPT=0"}, c.env...), "ls-remote", "planted")
			if f.ran() == "" && (c.used == nil || !c.used()) {
				t.Fatal("plain git did not use the plant: the test proves nothing")
			}
			proxied.Store(0)
			g := f.g
			g.Env = c.env
			ctx, cancel := context.WithTimeout(ctxT(t), time.Minute)
			defer cancel()
			if _, _, err := RemoteRef(ctx, g, f.repo, "planted", "main"); err == nil {
				t.Error("aq's ls-remote of the planted remote succeeded")
			}
			if ran := f.ran(); ran != "" {
				t.Errorf("aq's git ran the plant: %s", ran)
			}
			if c.used != nil && c.used() {
				t.Error("aq's git used the planted proxy")
			}
		})
	}
	// The operator's own credential helper (global configuration) runs.
	t.Run("trusted helper", func(t *testing.T) {
		f := newPlantFixture(t)
		testenv.Git(t, f.repo, "remote", "add", "planted", web.URL+"/r.git")
		testenv.Git(t, f.repo, "config", "credential.helper", f.marker)
		global := filepath.Join(t.TempDir(), "gitconfig")
		trusted := filepath.Join(t.TempDir(), "trusted-helper")
		testenv.WriteFile(t, trusted, "#!/bin/sh\necho \"trusted $*\" >> '"+f.marks+"'\n")
		os.Chmod(trusted, 0o755)
		testenv.Git(t, "", "config", "-f", global, "credential.helper", trusted)
		g := f.g
		g.Env = []string{"GIT_CONFIG_GLOBAL=" + global}
		RemoteRef(ctxT(t), g, f.repo, "planted", "main")
		if ran := f.ran(); !strings.HasPrefix(ran, "trusted get") || strings.Contains(ran, f.marker) {
			t.Errorf("ran %q, want the trusted helper alone", ran)
		}
	})
}
