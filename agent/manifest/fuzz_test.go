package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/job"
)

// FuzzParse: Parse never panics; every accepted job has a valid id and repo
// and a prompt; every refusal is Errors, one line per problem. The seed
// corpus (every testdata/*.md plus the cases below) runs in plain `go test`.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.md"))
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(filepath.Base(file), b)
		}
	}
	for _, s := range []string{
		"",
		"---",
		"---\n---\n",
		"---\nrepo: svc\n---\n",
		"---\nrepo: svc\n---\nx",
		"\ufeff---\r\nrepo: svc\r\n---\r\nx\r\n",
		"---\nrepo: &a [*a]\n---\nx\n",
		"---\n&a a: *a\n---\nx\n",
		"---\nrepo: svc\nbudget: {wall: 9999999999999h}\n---\nx\n",
		"---\nrepo: svc\npriority: 0x10\nbudget: {tokens: 0x7fffffffffffffff, turns: 1e400}\n---\nx\n",
		"---\nrepo: ssh://[::1]:22/x.git\n---\nx\n",
		"---\nrepo: https://h/%2e%2e\n---\nx\n",
		"---\nrepo: git@h:..\n---\nx\n",
		"---\nrepo: svc\n? [a, b]\n: c\n---\nx\n",
		"---\nrepo: svc\n!!binary aWQ=: x\n---\nx\n",
		"---\nrepo: svc\ndeps: [svc, svc]\nid: svc\n---\n## Acceptance\n",
		"---\nrepo: svc\n---\n# \n##\n## Acceptance\n#\n",
		"---\nrepo: svc\n---\nAcceptance\n---\n",
		"\n \n---\nrepo: svc\n---\n> ## Acceptance\n- [ ] x\n",
		"---\nrepo: svc\ntitle: \"\\u0000\"\n---\nx\n",
		"---\nrepo: svc\ntitle: \"\\x85\"\n---\nx\n",
	} {
		f.Add("x.md", []byte(s))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		j, err := Parse(name, data, nil)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is %T, want Errors: %v", err, err)
			}
			for _, e := range es {
				if msg := e.Error(); strings.ContainsAny(msg, "\r\n") {
					t.Fatalf("problem is not one line: %q", msg)
				}
				if e.Line < 0 {
					t.Fatalf("negative line: %v", e)
				}
			}
			if j != nil {
				t.Fatalf("returned a job and an error")
			}
			return
		}
		for what, v := range map[string]string{"id": j.ID, "repo": j.Repo} {
			if !mdmeta.NamePattern().MatchString(v) || strings.Contains(v, "..") {
				t.Fatalf("accepted %s %q", what, v)
			}
		}
		for _, dep := range j.Deps {
			if !mdmeta.NamePattern().MatchString(dep) || strings.Contains(dep, "..") || dep == j.ID {
				t.Fatalf("accepted dep %q", dep)
			}
		}
		if strings.TrimSpace(j.Body) == "" {
			t.Fatalf("accepted an empty prompt")
		}
		if CheckBranch(j.Base) != "" || CheckBase(j.ID, j.Base) != "" {
			t.Fatalf("accepted base %q", j.Base)
		}
		if !job.ValidID(j.ID) {
			t.Fatalf("accepted id %q", j.ID)
		}
		// A title never carries what could steer a terminal (issue #26).
		if strings.ContainsAny(j.Title, "\x1b\x07\r\n\x00") {
			t.Fatalf("accepted title %q", j.Title)
		}
		if j.Budget.Wall <= 0 {
			t.Fatalf("accepted wall %v", j.Budget.Wall)
		}
		if len(data) > MaxSize {
			t.Fatalf("accepted %d bytes", len(data))
		}
	})
}

// FuzzAdmit: a job from the coordinator — its id, repo, the id asked for
// and its manifest — is admitted only when the one admission rule holds
// (issue #26): a valid id that is the manifest's and the one asked for, a
// repository named (never by URL or path) and agreeing, a base to start
// from. A refusal is a reason and a message; invalid_job's is one short
// printable line. The seed corpus is testdata/fuzz/FuzzAdmit.
func FuzzAdmit(f *testing.F) {
	f.Add("j1", "app", "", "---\nid: j1\nrepo: app\nengine: script\nscript: make\n---\n# x\n", false)
	f.Fuzz(func(t *testing.T, id, repo, asked, body string, noScript bool) {
		p := Policy{}
		if noScript {
			p.Engines = []string{"claude", "codex", "devin"}
		}
		j, ref := Admit(Wire{ID: id, Repo: repo, Asked: asked, BodyMd: body}, nil, p)
		if ref != nil {
			if j != nil || ref.Reason == "" || ref.Msg == "" {
				t.Fatalf("refusal %+v with job %v", ref, j)
			}
			if ref.Reason != job.ReasonInvalidManifest && (len(ref.Msg) > 600 || strings.ContainsAny(ref.Msg, "\n\r\x1b")) {
				t.Fatalf("refusal is not one short printable line: %q", ref.Msg)
			}
			return
		}
		switch {
		case !job.ValidID(j.ID) || j.ID != id || asked != "" && asked != id:
			t.Fatalf("admitted id %q (coordinator %q, asked %q)", j.ID, id, asked)
		case mdmeta.CheckName(j.Repo) != "" || j.RepoURL != "" || repo != "" && repo != j.Repo:
			t.Fatalf("admitted repo %q (url %q, coordinator %q)", j.Repo, j.RepoURL, repo)
		case CheckBase(j.ID, j.Base) != "":
			t.Fatalf("admitted base %q", j.Base)
		case noScript && j.Engine == "script":
			t.Fatal("admitted a script job on a factory that does not run script")
		}
	})
}
