package repos_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func TestParseAndResolve(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "urls")
	testenv.WriteFile(t, file, `# repos this pool runs
app https://github.com/acme/app.git
web git@github.com:acme/web.git
tools file:///srv/git/tools.git
secret https://bot:hunter2@github.com/acme/secret.git
odd https://example.com/odd.git extra
bad/name https://example.com/x.git
* https://github.com/acme/{repo}.git
`)
	r, warnings, err := repos.Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "line 7") || !strings.Contains(warnings[0], `"bad/name" is not a repo name`) {
		t.Fatalf("warnings %q", warnings)
	}
	if got := strings.Join(r.Names(), ","); got != "app,tools,web" {
		t.Fatalf("names %s", got)
	}
	for _, c := range []struct {
		name, url, err string
		ok             bool
	}{
		{"app", "https://github.com/acme/app.git", "", true},
		{"web", "git@github.com:acme/web.git", "", true},
		{"tools", "file:///srv/git/tools.git", "", true},
		{"other", "https://github.com/acme/other.git", "", true}, // the template
		{"secret", "", "line 5: the URL https://bot:xxxxx@github.com/acme/secret.git carries a password: put the credential in a git credential helper", false},
		{"odd", "", "line 6: want `name url`, found 3 fields", false},
	} {
		u, ok, err := r.Resolve(c.name)
		if u != c.url || ok != c.ok || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("Resolve(%s) = %q, %v, %v; want %q, %v, error with %q", c.name, u, ok, err, c.url, c.ok, c.err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("the password reached the error: %v", err)
		}
	}

	tpl, _, err := repos.Parse("https://github.com/acme/{repo}.git")
	if u, ok, _ := tpl.Resolve("svc"); err != nil || !ok || u != "https://github.com/acme/svc.git" || len(tpl.Names()) != 0 {
		t.Fatalf("template: %q %v %v names %v", u, ok, err, tpl.Names())
	}
	if _, ok, _ := (*repos.Resolver)(nil).Resolve("app"); ok {
		t.Fatal("a nil resolver resolved")
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), "https://tok:s3cr3t@github.com/{repo}.git", "ftp://host/{repo}"} {
		if _, _, err := repos.Parse(bad); err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("Parse(%q) = %v, want an error without the password", bad, err)
		}
	}
}

// origin is a bare repository with a few commits that serves partial clones.
func origin(t *testing.T) string {
	t.Helper()
	src := testenv.NewRepo(t, t.TempDir(), "app", map[string]string{"a.txt": "a\n", "dir/b.txt": "b\n"})
	for i := range 3 {
		testenv.WriteFile(t, filepath.Join(src, "n.txt"), strings.Repeat("x", i+1))
		testenv.Git(t, src, "add", "-A")
		testenv.Git(t, src, "commit", "-q", "-m", "more")
	}
	bare := testenv.AddOrigin(t, src)
	testenv.Git(t, bare, "config", "uploadpack.allowFilter", "true")
	testenv.Git(t, bare, "config", "uploadpack.allowAnySHA1InWant", "true")
	return bare
}

func TestCloneIsBloblessAndLeavesNothingOnFailure(t *testing.T) {
	testenv.Slow(t, "clones real repositories")
	ctx := context.Background()
	bare := origin(t)
	base := t.TempDir()
	g := &worktree.Git{}
	dir := filepath.Join(base, "app")
	if err := repos.Clone(ctx, g, "file://"+bare, dir, ""); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, dir, "config", "remote.origin.partialclonefilter"); strings.TrimSpace(got) != "blob:none" {
		t.Fatalf("partial clone filter %q, want blob:none", got)
	}
	// A worktree of it checks out (blobs fetched on demand).
	wt := filepath.Join(t.TempDir(), "wt")
	testenv.Git(t, dir, "worktree", "add", "-q", "-b", "j", wt, "origin/main")
	if testenv.ReadFile(t, filepath.Join(wt, "dir/b.txt")) != "b\n" {
		t.Fatal("the worktree of a blobless clone lacks its files")
	}

	// A clone that fails leaves no directory and no temporary behind.
	missing := filepath.Join(base, "nope")
	err := repos.Clone(ctx, g, "file://"+filepath.Join(t.TempDir(), "no-such.git"), missing, "")
	if err == nil || !strings.Contains(err.Error(), "cannot clone file://") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("clone of a missing origin: %v", err)
	}
	entries, _ := os.ReadDir(base)
	if len(entries) != 1 || entries[0].Name() != "app" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("repo base after a failed clone: %v, want only app", names)
	}
	if err := repos.Clone(ctx, g, "https://u:secret@example.com/x.git", filepath.Join(base, "x"), ""); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("a URL with a password: %v", err)
	}
}

// With a mirror the clone borrows its objects (alternates) instead of
// fetching them; a mirror without the repo is ignored.
func TestCloneBorrowsFromAMirror(t *testing.T) {
	testenv.Slow(t, "clones real repositories")
	ctx := context.Background()
	bare := origin(t)
	mirror := t.TempDir()
	testenv.Git(t, mirror, "clone", "-q", "--mirror", bare, filepath.Join(mirror, "app.git"))
	dir := filepath.Join(t.TempDir(), "app")
	if err := repos.Clone(ctx, &worktree.Git{}, "file://"+bare, dir, mirror); err != nil {
		t.Fatal(err)
	}
	alt, err := os.ReadFile(filepath.Join(dir, ".git", "objects", "info", "alternates"))
	if err != nil || !strings.Contains(string(alt), filepath.Join(mirror, "app.git")) {
		t.Fatalf("alternates %q (%v): the clone did not borrow from the mirror", alt, err)
	}
	other := filepath.Join(t.TempDir(), "app")
	if err := repos.Clone(ctx, &worktree.Git{}, "file://"+bare, other, t.TempDir()); err != nil {
		t.Fatalf("a mirror without the repo: %v", err)
	}
	if testenv.Exists(filepath.Join(other, ".git", "objects", "info", "alternates")) {
		t.Fatal("borrowed from a mirror that lacks the repo")
	}
}
