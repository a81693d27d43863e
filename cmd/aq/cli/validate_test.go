package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// manifestEnv isolates aq's configuration (cleanEnv) and returns a fresh
// AQ_HOME and a folder for manifests, both made.
func manifestEnv(t *testing.T) (home, jobs string) {
	t.Helper()
	dir := clitest.CleanEnv(t)
	home, jobs = filepath.Join(dir, "aqhome"), filepath.Join(dir, "jobs")
	for _, d := range []string{home, jobs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return home, jobs
}

// writeFile is testenv.WriteFile returning path.
func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	testenv.WriteFile(t, path, content)
	return path
}

// readyHost gives this test a host with what goodManifest needs, so that
// aq validate has nothing to warn about whatever the machine has: claude
// and gh on PATH (stand-ins that are never run) and repo svc under
// AQ_REPO_BASE.
func readyHost(t *testing.T) {
	t.Helper()
	bin := t.TempDir()
	for _, name := range []string{"claude", "gh"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	base := t.TempDir()
	testenv.NewRepo(t, base, "svc", nil)
	t.Setenv("AQ_REPO_BASE", base)
}

const goodManifest = "---\nrepo: svc\nprofile: backend-dev\nengine: claude\n---\n# Fix it\n\nFix the bug.\n\n## Acceptance\n- fixed\n"

func TestValidateOK(t *testing.T) {
	_, jobs := manifestEnv(t)
	readyHost(t)
	a := writeFile(t, filepath.Join(jobs, "fix-a.md"), goodManifest)
	b := writeFile(t, filepath.Join(jobs, "fix-b.md"), "---\nid: other\nrepo: git@github.com:org/web.git\n---\nDo it.\n")

	out, errOut, code := runAQ(t, "validate", a, b)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	want := "ok " + a + " id=fix-a repo=svc engine=claude\n" + "ok " + b + " id=other repo=web engine=any\n"
	if out != want {
		t.Errorf("stdout\n%s\nwant\n%s", out, want)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	_, jobs := manifestEnv(t)
	readyHost(t)
	good := writeFile(t, filepath.Join(jobs, "good.md"), goodManifest)
	bad := writeFile(t, filepath.Join(jobs, "bad.md"), "---\nrepo: svc\ntitel: x\nengine: gpt\n---\nx\n")
	missing := filepath.Join(jobs, "missing.md")

	out, errOut, code := runAQ(t, "validate", good, bad, missing)
	if code != 2 {
		t.Errorf("exit %d, want 2 (a file that cannot be read is a usage error)", code)
	}
	if out != "ok "+good+" id=good repo=svc engine=claude\n" {
		t.Errorf("stdout %q", out)
	}
	want := []string{
		bad + `:3: unknown key "titel" (did you mean "title"?)`,
		bad + `:4: engine "gpt" is not known (use one of: claude, codex, devin, script, any)`,
		missing + `: cannot read: no such file or directory (check the path and its permissions)`,
	}
	if got := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("stderr\n%s\nwant\n%s", errOut, strings.Join(want, "\n"))
	}
}

func TestValidateJSON(t *testing.T) {
	_, jobs := manifestEnv(t)
	readyHost(t)
	good := writeFile(t, filepath.Join(jobs, "good.md"), goodManifest)
	bad := writeFile(t, filepath.Join(jobs, "bad.md"), "---\nrepo: ../x\n---\nx\n")

	out, errOut, code := runAQ(t, "validate", "--json", good)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got []job.Job
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stdout is not a JSON array of jobs: %v\n%s", err, out)
	}
	if len(got) != 1 {
		t.Fatalf("%d jobs", len(got))
	}
	j := got[0]
	if j.ID != "good" || j.Repo != "svc" || j.Engine != "claude" || j.Profile != "backend-dev" || j.Source != good ||
		j.Acceptance != "- fixed" || j.PriorityName != "normal" || !strings.Contains(j.Persona, ".aq_pr.md") {
		t.Errorf("job %+v", j)
	}
	// Field names are the documented ones.
	for _, key := range []string{`"id"`, `"repo"`, `"base"`, `"engine"`, `"capabilities"`, `"priority"`, `"priorityName"`, `"budget"`, `"depsMode"`, `"retry"`, `"ship"`, `"body"`, `"persona"`, `"acceptance"`, `"source"`} {
		if !strings.Contains(out, key+":") {
			t.Errorf("JSON lacks %s", key)
		}
	}

	// Invalid files: errors on stderr, stdout stays valid JSON.
	out, errOut, code = runAQ(t, "validate", "--json", bad)
	if code != 1 || strings.TrimSpace(out) != "[]" || !strings.HasPrefix(errOut, bad+":2: ") {
		t.Errorf("exit %d stdout %q stderr %q", code, out, errOut)
	}
}

// TestValidateUnreadableIsUsage: a file that does not exist, is a
// directory or cannot be read is the command line's mistake — exit 2, as
// aq submit gives — while a file that was read and is invalid is exit 1.
func TestValidateUnreadableIsUsage(t *testing.T) {
	_, jobs := manifestEnv(t)
	good := writeFile(t, filepath.Join(jobs, "good.md"), goodManifest)
	bad := writeFile(t, filepath.Join(jobs, "bad.md"), "---\nrepo: svc\ntitel: x\n---\nx\n")
	locked := writeFile(t, filepath.Join(jobs, "locked.md"), goodManifest)
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}
	unreadable := []string{filepath.Join(jobs, "missing.md"), jobs}
	if f, err := os.Open(locked); err == nil {
		f.Close() // root reads it anyway: nothing to test with it
	} else {
		unreadable = append(unreadable, locked)
	}
	for _, path := range unreadable {
		for _, cmd := range []string{"validate", "submit"} {
			_, errOut, code := runAQ(t, cmd, good, path)
			if code != 2 || !strings.Contains(errOut, path+": ") {
				t.Errorf("aq %s %s: exit %d, want 2; stderr %q", cmd, path, code, errOut)
			}
		}
		if _, _, code := runAQ(t, "validate", bad, path); code != 2 {
			t.Errorf("validate of an invalid and an unreadable file: exit %d, want 2", code)
		}
	}
	if _, _, code := runAQ(t, "validate", good, bad); code != 1 {
		t.Errorf("an invalid file alone: exit %d, want 1", code)
	}
}

// TestValidateShowsTheRetryBackoffApplied: a manifest without
// retry.backoff shows the 30s the runner waits before a retry (docs/manifest.md).
func TestValidateShowsTheRetryBackoffApplied(t *testing.T) {
	_, jobs := manifestEnv(t)
	plain := writeFile(t, filepath.Join(jobs, "plain.md"), goodManifest)
	set := writeFile(t, filepath.Join(jobs, "set.md"), "---\nrepo: svc\nretry: { max: 1, backoff: 2m }\n---\nx\n")
	out, errOut, code := runAQ(t, "validate", "--json", plain, set)
	var got []job.Job
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 2 {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
	}
	if !strings.Contains(out, `"backoff": "30s"`) || got[0].Retry.Backoff.D() != job.DefaultBackoff {
		t.Errorf("unset backoff shows %s, want 30s:\n%s", got[0].Retry.Backoff, out)
	}
	if got[1].Retry.Backoff.D() != 2*time.Minute {
		t.Errorf("a set backoff shows %s, want 2m", got[1].Retry.Backoff)
	}
}

// TestValidateAndSubmitWarnWhatThisHostLacks: a valid job this host could
// not run or ship — its engine not installed, its repository misspelt, gh
// missing for ship: pr — passes validate and is submitted, with one
// "FILE: warning:" line on stderr for each, saying what happens and how to
// fix it; a job the host can run gets none.
func TestValidateAndSubmitWarnWhatThisHostLacks(t *testing.T) {
	home, jobs := manifestEnv(t)
	base := filepath.Join(home, "..", "src")
	testenv.NewRepo(t, base, "webapp", nil)
	t.Setenv("AQ_REPO_BASE", base)
	t.Setenv("PATH", t.TempDir()) // no claude, no gh
	typo := writeFile(t, filepath.Join(jobs, "norepo.md"), "---\nrepo: webap\nengine: claude\nship: pr\n---\n# Fix the title\n")
	fine := writeFile(t, filepath.Join(jobs, "fine.md"), "---\nrepo: webapp\nengine: script\nscript: echo hi > hi.txt\n---\n# Say hi\n")
	wants := []string{
		typo + `: warning: engine claude is not installed on this host (no "claude" on PATH): aq run leaves the job in the inbox until it is`,
		typo + ": warning: repo webap is not a git repository under AQ_REPO_BASE",
		"(did you mean repo: webapp?",
		typo + ": warning: ship: pr needs the GitHub CLI gh, which is not installed on this host",
	}
	for _, cmd := range []string{"validate", "submit"} {
		out, errOut, code := runAQ(t, cmd, typo)
		if code != 0 {
			t.Fatalf("aq %s: exit %d (warnings do not refuse); stderr %q", cmd, code, errOut)
		}
		for _, w := range wants {
			if !strings.Contains(errOut, w) {
				t.Errorf("aq %s: stderr lacks %q:\n%s", cmd, w, errOut)
			}
		}
		if n := strings.Count(errOut, "\n"); n != 3 {
			t.Errorf("aq %s: %d lines on stderr, want 3 warnings:\n%s", cmd, n, errOut)
		}
		if cmd == "submit" && out != "submitted norepo to inbox\n" {
			t.Errorf("aq submit: stdout %q", out)
		}
		if _, errOut, code := runAQ(t, cmd, fine); code != 0 || errOut != "" {
			t.Errorf("aq %s of a job this host can run: exit %d stderr %q", cmd, code, errOut)
		}
	}
	// validate --json keeps stdout JSON; the warnings are on stderr.
	out, errOut, code := runAQ(t, "validate", "--json", typo)
	var got []job.Job
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 1 || !strings.Contains(errOut, "warning: repo webap") {
		t.Errorf("validate --json: exit %d stdout %q stderr %q", code, out, errOut)
	}
	// An engine this host has but does not run (AQ_ENGINES) waits as one
	// not installed would: said the same way.
	t.Setenv("AQ_ENGINES", "claude,codex")
	if _, errOut, code := runAQ(t, "validate", fine); code != 0 || errOut != fine+": warning: engine script is not among the engines this host runs "+
		"(claude, codex; AQ_ENGINES sets them, docs/fleet.md): aq run leaves the job in the inbox (add script to AQ_ENGINES, or choose one of those engines)\n" {
		t.Errorf("validate under AQ_ENGINES without script: exit %d stderr %q", code, errOut)
	}
}

func TestValidateUsage(t *testing.T) {
	manifestEnv(t)
	out, errOut, code := runAQ(t, "validate")
	if code != 2 || out != "" || errOut != "aq: no manifest files given (name one or more manifests, e.g. aq validate jobs/*.md)\n" {
		t.Errorf("exit %d stdout %q stderr %q", code, out, errOut)
	}
	_, _, code = runAQ(t, "validate", "--nope", "x.md")
	if code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
}

// TestValidateUsesProfileOverrides: $AQ_HOME/profiles is read, and a broken
// override is a configuration error (exit 2) named by file and line.
func TestValidateUsesProfileOverrides(t *testing.T) {
	home, jobs := manifestEnv(t)
	writeFile(t, filepath.Join(home, "profiles", "backend-dev.md"), "---\nengine: codex\n---\nHouse persona.\n")
	writeFile(t, filepath.Join(home, "profiles", "ml.md"), "---\ncapabilities: [has:python3]\n---\nML persona.\n")
	a := writeFile(t, filepath.Join(jobs, "a.md"), "---\nrepo: svc\nprofile: backend-dev\n---\nx\n")
	b := writeFile(t, filepath.Join(jobs, "b.md"), "---\nrepo: svc\nprofile: ml\n---\nx\n")

	out, errOut, code := runAQ(t, "validate", "--json", a, b)
	var got []job.Job
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 2 {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
	}
	if got[0].Engine != "codex" || got[0].Persona != "House persona." {
		t.Errorf("override not used: %+v", got[0])
	}
	if got[1].Persona != "ML persona." || strings.Join(got[1].Capabilities, ",") != "has:python3" {
		t.Errorf("added profile not used: %+v", got[1])
	}

	broken := writeFile(t, filepath.Join(home, "profiles", "broken.md"), "---\nengine: claude\nbudgt: {}\n---\nx\n")
	out, errOut, code = runAQ(t, "validate", a)
	if code != 2 || out != "" || !strings.HasPrefix(errOut, broken+`:3: unknown key "budgt" (did you mean "budget"?)`) {
		t.Errorf("exit %d stdout %q stderr %q", code, out, errOut)
	}
}

// TestValidateVerifyRounds: verify_rounds negative or not a number is one
// FILE:LINE line each and exit 1; a good one is in the normalised job.
func TestValidateVerifyRounds(t *testing.T) {
	_, jobs := manifestEnv(t)
	neg := writeFile(t, filepath.Join(jobs, "neg.md"), "---\nrepo: svc\nverify: make test\nverify_rounds: -2\n---\nx\n")
	word := writeFile(t, filepath.Join(jobs, "word.md"), "---\nrepo: svc\nverify_rounds: twice\n---\nx\n")
	out, errOut, code := runAQ(t, "validate", neg, word)
	want := neg + ":4: verify_rounds -2 is out of range (use a whole number from 0 to 10)\n" +
		word + `:3: verify_rounds must be a whole number, not "twice" (write a whole number, e.g. verify_rounds: 2)` + "\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("exit %d stdout %q stderr\n%s\nwant\n%s", code, out, errOut, want)
	}
	good := writeFile(t, filepath.Join(jobs, "good.md"), "---\nrepo: svc\nverify: make test\nverify_rounds: 1\n---\nx\n")
	out, errOut, code = runAQ(t, "validate", "--json", good)
	var got []job.Job
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 1 || got[0].VerifyRounds == nil || *got[0].VerifyRounds != 1 {
		t.Errorf("exit %d stdout %q stderr %q", code, out, errOut)
	}
}

// TestValidateAndSubmitWarnHiddenPaths (#34): a script: file under /tmp and
// a verify program in the home are there on the host but hidden from the
// job by its sandbox: validate and submit say so, with the path, why and
// the fix; in the repository, or with AQ_SANDBOX=off, nothing is said.
func TestValidateAndSubmitWarnHiddenPaths(t *testing.T) {
	home, jobs := manifestEnv(t)
	base := filepath.Join(home, "..", "src")
	testenv.NewRepo(t, base, "webapp", nil)
	t.Setenv("AQ_REPO_BASE", base)
	script := writeFile(t, filepath.Join(t.TempDir(), "fix.sh"), "#!/bin/sh\necho fixed > x.txt\n")
	hidden := writeFile(t, filepath.Join(jobs, "hidden.md"), "---\nrepo: webapp\nengine: script\nscript: sh "+script+"\nverify: ~/bin/check ./...\n---\n# Fix it\n")
	fine := writeFile(t, filepath.Join(jobs, "fine.md"), "---\nrepo: webapp\nengine: script\nscript: sh ./fix.sh\nverify: make check > /tmp/check.log\n---\n# Fix it\n")
	fix := "(put it in the repository, name its folder in AQ_SANDBOX_WRITABLE, or set AQ_SANDBOX=off)"
	wants := []string{
		hidden + ": warning: script: names " + script + ", which the job's sandbox hides: /tmp is the job's own inside the sandbox, so the job would fail as if it were missing " + fix + "\n",
		hidden + ": warning: verify: names " + filepath.Join(os.Getenv("HOME"), "bin", "check") + ", which the job's sandbox hides: " + os.Getenv("HOME") + " (the home) is the job's own inside the sandbox",
	}
	for _, cmd := range []string{"validate", "submit"} {
		_, errOut, code := runAQ(t, cmd, hidden)
		if code != 0 {
			t.Fatalf("aq %s: exit %d (warnings do not refuse); stderr %q", cmd, code, errOut)
		}
		for _, w := range wants {
			if !strings.Contains(errOut, w) {
				t.Errorf("aq %s: stderr lacks\n%s\nit is:\n%s", cmd, w, errOut)
			}
		}
		if _, errOut, code := runAQ(t, cmd, fine); code != 0 || errOut != "" {
			t.Errorf("aq %s of paths in the repository: exit %d stderr %q", cmd, code, errOut)
		}
	}
	t.Setenv("AQ_SANDBOX", "off")
	if _, errOut, code := runAQ(t, "validate", hidden); code != 0 || errOut != "" {
		t.Errorf("aq validate with AQ_SANDBOX=off: exit %d stderr %q", code, errOut)
	}
}

// TestValidateMayChangeAndProtectedPaths (#32): a may_change entry outside
// the repository is the manifest's error, one line naming the key and the
// fix (validate exits 1, as for every invalid manifest; submit refuses it
// with 2 and queues nothing); a malformed AQ_PROTECTED_PATHS is a configuration
// error (exit 2) for validate and submit alike. A good may_change adds
// manifest:may_change.
func TestValidateMayChangeAndProtectedPaths(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	home, jobs := manifestEnv(t)
	readyHost(t)
	out := writeFile(t, filepath.Join(jobs, "out.md"), "---\nrepo: svc\nmay_change: [.github/workflows/ci.yml, ../ci.yml]\n---\nx\n")
	stdout, errOut, code := runAQ(t, "validate", out)
	want := out + `:3: may_change: "../ci.yml" is outside the repository: write a path below its root, without '..' (e.g. .github/workflows/ci.yml) (name paths inside the repository, relative to its root, e.g. may_change: [.github/workflows/ci.yml])` + "\n"
	if code != 1 || stdout != "" || errOut != want {
		t.Errorf("validate: exit %d stdout %q stderr\n%s\nwant\n%s", code, stdout, errOut, want)
	}
	if _, errOut, code := runAQ(t, "submit", out); code != 2 || !strings.Contains(errOut, "is outside the repository") || !strings.Contains(errOut, "nothing was submitted") {
		t.Errorf("submit: exit %d stderr %q", code, errOut)
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "queue", "inbox")); len(entries) != 0 {
		t.Errorf("submit queued %d files for a refused manifest", len(entries))
	}

	good := writeFile(t, filepath.Join(jobs, "good.md"), "---\nrepo: svc\nmay_change: [\".github/workflows/**\"]\n---\nx\n")
	stdout, errOut, code = runAQ(t, "validate", "--json", good)
	var got []job.Job
	if code != 0 || json.Unmarshal([]byte(stdout), &got) != nil || len(got) != 1 ||
		!slices.Equal(got[0].MayChange, []string{".github/workflows/**"}) || !slices.Contains(got[0].Capabilities, job.MayChangeRequired) {
		t.Errorf("good may_change: exit %d stdout %q stderr %q", code, stdout, errOut)
	}

	t.Setenv("AQ_PROTECTED_PATHS", ".github/**,ci/[x")
	for _, cmd := range []string{"validate", "submit"} {
		_, errOut, code := runAQ(t, cmd, good)
		if code != 2 || !strings.Contains(errOut, `AQ_PROTECTED_PATHS=".github/**,ci/[x" entry "ci/[x" is not a valid glob`) || strings.Count(strings.TrimSpace(errOut), "\n") > 1 {
			t.Errorf("%s with a malformed AQ_PROTECTED_PATHS: exit %d stderr %q; want exit 2 and the line", cmd, code, errOut)
		}
	}
}
