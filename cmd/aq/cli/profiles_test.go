package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestProfilesList(t *testing.T) {
	manifestEnv(t)
	out, errOut, code := runAQ(t, "profiles", "list")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 6 || strings.Join(strings.Fields(lines[0]), " ") != "NAME ENGINE MODEL CAPABILITIES BUDGET SOURCE" {
		t.Fatalf("table:\n%s", out)
	}
	var frontend string
	for _, l := range lines {
		if strings.HasPrefix(l, "frontend-dev ") {
			frontend = strings.Join(strings.Fields(l), " ")
		}
	}
	if want := "frontend-dev any - has:git,node:>=20 wall=1h usd=10 tokens=4000000 turns=200 embedded"; frontend != want {
		t.Errorf("frontend-dev row %q, want %q", frontend, want)
	}
}

func TestProfilesListJSON(t *testing.T) {
	home, _ := manifestEnv(t)
	override := writeFile(t, filepath.Join(home, "profiles", "reviewer.md"), "---\nengine: claude\nmodel: claude-opus-4-1\n---\nStrict.\n")
	out, errOut, code := runAQ(t, "profiles", "list", "--json")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var names []string
	for _, p := range list {
		names = append(names, p["name"].(string))
		if _, ok := p["persona"]; ok {
			t.Errorf("list --json carries the persona of %s", p["name"])
		}
		for _, k := range []string{"name", "capabilities", "budget", "source"} {
			if _, ok := p[k]; !ok {
				t.Errorf("%s lacks %q", p["name"], k)
			}
		}
		if p["name"] == "reviewer" && (p["source"] != override || p["model"] != "claude-opus-4-1" || p["engine"] != "claude") {
			t.Errorf("reviewer override: %v", p)
		}
	}
	if strings.Join(names, ",") != "backend-dev,docs-writer,frontend-dev,refactorer,reviewer,security-auditor,test-fixer" {
		t.Errorf("names %v", names)
	}
}

func TestProfilesShow(t *testing.T) {
	manifestEnv(t)
	out, errOut, code := runAQ(t, "profiles", "show", "test-fixer")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
	for _, want := range []string{"name:          test-fixer\n", "capabilities:  has:git\n", "budget:        wall=45m usd=6 tokens=3000000 turns=150\n", "source:        embedded\n", "\nYou are an engineer who makes failing test suites green", ".aq_pr.md"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, _, code = runAQ(t, "profiles", "show", "docs-writer", "--json")
	var p map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil {
		t.Fatalf("exit %d: %s", code, out)
	}
	if p["name"] != "docs-writer" || !strings.Contains(p["persona"].(string), "technical writer") || p["source"] != "embedded" {
		t.Errorf("json %v", p)
	}
}

func TestProfilesUsageErrors(t *testing.T) {
	manifestEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"profiles", "show", "reviwer"}, `aq: no profile named "reviwer" (did you mean "reviewer"? known profiles: backend-dev, docs-writer, frontend-dev, refactorer, reviewer, security-auditor, test-fixer)`},
		{[]string{"profiles", "show", "zzz"}, `aq: no profile named "zzz" (known profiles: backend-dev,`},
		{[]string{"profiles", "show"}, `aq: aq profiles show takes exactly one profile name`},
		{[]string{"profiles", "show", "a", "b"}, `aq: aq profiles show takes exactly one profile name`},
		{[]string{"profiles", "list", "extra"}, `aq: `},
		{[]string{"profiles", "nope"}, `aq: unknown command "nope" for aq profiles`},
	} {
		out, errOut, code := runAQ(t, tc.args...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d stdout %q stderr %q, want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	out, _, code := runAQ(t, "profiles")
	if code != 0 || !strings.Contains(out, "aq profiles [command]") {
		t.Errorf("bare 'aq profiles': exit %d\n%s", code, out)
	}
}

func TestProfilesBrokenOverride(t *testing.T) {
	home, _ := manifestEnv(t)
	bad := writeFile(t, filepath.Join(home, "profiles", "x.md"), "---\nname: y\n---\nP.\n")
	out, errOut, code := runAQ(t, "profiles", "list")
	if code != 2 || out != "" || !strings.HasPrefix(errOut, bad+`:2: name "y" does not match the file name "x.md"`) {
		t.Errorf("exit %d stdout %q stderr %q", code, out, errOut)
	}
}
