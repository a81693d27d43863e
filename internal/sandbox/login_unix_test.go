//go:build unix

package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var claudeRefresh = []string{"claudeAiOauth.accessToken", "claudeAiOauth.refreshToken", "claudeAiOauth.expiresAt"}

const claudeLogin = `{"claudeAiOauth":{"accessToken":"a1","refreshToken":"r1","expiresAt":1000,"scopes":["user:inference"],"subscriptionType":"max"}}`

// loginJob is a host home holding a claude login and settings, and a job
// whose home got copies of them.
func loginJob(t *testing.T) (j *Jail, l *Logins, creds, settings string) {
	t.Helper()
	host := t.TempDir()
	creds = filepath.Join(host, ".claude", ".credentials.json")
	settings = filepath.Join(host, ".claude", "settings.json")
	for path, content := range map[string]string{creds: claudeLogin, settings: `{"theme":"dark"}`} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	j = &Jail{p: Policy{JobDir: t.TempDir()}}
	if err := makeJobDir(j.p); err != nil {
		t.Fatal(err)
	}
	files := []LoginFile{
		{Src: creds, Rel: ".claude/.credentials.json", Rotates: true, Refresh: claudeRefresh},
		{Src: settings, Rel: ".claude/settings.json"},
		{Src: filepath.Join(host, "absent.json"), Rel: "absent.json", Rotates: true},
	}
	l, err := j.CopyLogins(files)
	if err != nil {
		t.Fatal(err)
	}
	return j, l, creds, settings
}

// TestLoginsWriteBack: a login the engine refreshed in its copy reaches
// the original; one the host changed meanwhile keeps the host's; one
// that does not rotate is never written back.
func TestLoginsWriteBack(t *testing.T) {
	j, l, creds, settings := loginJob(t)
	copyOf := func(rel string) string { return filepath.Join(j.p.JobHome(), rel) }
	if st, err := os.Stat(copyOf(".claude/.credentials.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the copy: %v %v", st, err)
	}
	if _, err := os.Stat(copyOf("absent.json")); err == nil {
		t.Error("a login file the host lacks was made up")
	}
	if notes, _ := l.WriteBack(); len(notes) != 0 {
		t.Errorf("nothing changed, yet: %v", notes)
	}

	// The engine refreshes its token (the refresh token rotates) and
	// rewrites its settings.
	refreshed := strings.NewReplacer(`"a1"`, `"a2"`, `"r1"`, `"r2"`, "1000", "2000").Replace(claudeLogin)
	os.WriteFile(copyOf(".claude/.credentials.json"), []byte(refreshed), 0o600)
	os.WriteFile(copyOf(".claude/settings.json"), []byte(`{"theme":"light"}`), 0o600)
	notes, _ := l.WriteBack()
	if b, _ := os.ReadFile(creds); string(b) != refreshed || len(notes) != 1 || !strings.Contains(notes[0], "written back") {
		t.Errorf("the refreshed login was not written back: %q, notes %v", b, notes)
	}
	if b, _ := os.ReadFile(settings); string(b) != `{"theme":"dark"}` {
		t.Errorf("settings, which do not rotate, were written back: %q", b)
	}
	if st, _ := os.Stat(creds); st.Mode().Perm() != 0o600 {
		t.Errorf("the written-back login is %v, want 0600", st.Mode().Perm())
	}

	// The user logs in again on the host while the engine refreshes once
	// more: the host's wins.
	user := strings.ReplaceAll(claudeLogin, `"r1"`, `"user"`)
	os.WriteFile(creds, []byte(user), 0o600)
	os.WriteFile(copyOf(".claude/.credentials.json"), []byte(strings.ReplaceAll(refreshed, `"r2"`, `"r3"`)), 0o600)
	notes, _ = l.WriteBack()
	if b, _ := os.ReadFile(creds); string(b) != user || len(notes) != 1 || !strings.Contains(notes[0], "kept") {
		t.Errorf("the host's newer login was overwritten: %q, notes %v", b, notes)
	}
}

// TestLoginWriteBackOnlyAsALogin: the engine's copy is written back only
// when it is its login with the refresh's fields changed — never another
// file behind a link, never a FIFO (and WriteBack returns), never other
// fields, never another format or an oversized file. Without the by-field
// rule and the safe read, each of these rows reached the user's login.
func TestLoginWriteBackOnlyAsALogin(t *testing.T) {
	gh := filepath.Join(t.TempDir(), "hosts.yml")
	os.WriteFile(gh, []byte("github.com:\n  oauth_token: gho_0123456789abcdef\n"), 0o600)
	for _, c := range []struct {
		name  string
		plant func(t *testing.T, copyPath string)
		want  string // in the note
	}{
		{"symlink to a host file", func(t *testing.T, p string) { os.Remove(p); os.Symlink(gh, p) }, "is a symbolic link"},
		{"FIFO", func(t *testing.T, p string) { os.Remove(p); unix.Mkfifo(p, 0o600) }, "is a FIFO"},
		{"oversized", func(t *testing.T, p string) {
			os.WriteFile(p, []byte(`{"claudeAiOauth":{"accessToken":"`+strings.Repeat("x", 70<<10)+`"}}`), 0o600)
		}, "larger than the 64 KiB cap"},
		{"another account", func(t *testing.T, p string) {
			os.WriteFile(p, []byte(strings.ReplaceAll(claudeLogin, `"max"`, `"pro"`)), 0o600)
		}, "claudeAiOauth.subscriptionType"},
		{"a field added", func(t *testing.T, p string) {
			os.WriteFile(p, []byte(strings.Replace(claudeLogin, `{"claudeAiOauth"`, `{"gh":"gho_x","claudeAiOauth"`, 1)), 0o600)
		}, "gh"},
		{"a token made an object", func(t *testing.T, p string) {
			os.WriteFile(p, []byte(strings.ReplaceAll(claudeLogin, `"a1"`, `{"x":1}`)), 0o600)
		}, "claudeAiOauth.accessToken"},
		{"not JSON", func(t *testing.T, p string) { os.WriteFile(p, []byte("oauth_token: gho_x\n"), 0o600) }, "not JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			j, l, creds, _ := loginJob(t)
			c.plant(t, filepath.Join(j.p.JobHome(), ".claude", ".credentials.json"))
			done := make(chan struct{})
			var notes []string
			go func() { notes, _ = l.WriteBack(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Fatal("WriteBack did not return")
			}
			if b, _ := os.ReadFile(creds); string(b) != claudeLogin {
				t.Errorf("the user's login was overwritten with %q", b)
			}
			if len(notes) != 1 || !strings.Contains(notes[0], "the engine's copy of its login was not written back") || !strings.Contains(notes[0], c.want) {
				t.Errorf("notes %q, want one saying %q", notes, c.want)
			}
		})
	}
}

func TestLoginChangeByEngine(t *testing.T) {
	codex := LoginFile{Rel: ".codex/auth.json", Refresh: []string{"tokens.**", "last_refresh"}}
	devin := LoginFile{Rel: ".local/share/devin/credentials.toml", Refresh: []string{"**.access_token", "**.refresh_token", "**.expires_at"}}
	for _, c := range []struct {
		name      string
		f         LoginFile
		was, is   string
		refusedAt string
	}{
		{"codex refresh", codex, `{"OPENAI_API_KEY":null,"tokens":{"id_token":"i","access_token":"a","refresh_token":"r","account_id":"acc"},"last_refresh":"t1"}`,
			`{"OPENAI_API_KEY":null,"tokens":{"id_token":"i2","access_token":"a2","refresh_token":"r2","account_id":"acc"},"last_refresh":"t2"}`, ""},
		{"codex key set", codex, `{"OPENAI_API_KEY":null,"tokens":{"access_token":"a"}}`, `{"OPENAI_API_KEY":"sk-x","tokens":{"access_token":"a"}}`, "OPENAI_API_KEY"},
		{"devin refresh", devin, "[auth]\naccess_token = \"a\"\nrefresh_token = \"r\"\nexpires_at = 1\nuser = \"me\"\n",
			"[auth]\naccess_token = \"a2\"\nrefresh_token = \"r2\"\nexpires_at = 2\nuser = \"me\"\n", ""},
		{"devin user", devin, "[auth]\naccess_token = \"a\"\nuser = \"me\"\n", "[auth]\naccess_token = \"a\"\nuser = \"you\"\n", "auth.user"},
		{"devin JSON", devin, "[auth]\naccess_token = \"a\"\n", `{"auth":{"access_token":"b"}}`, "not TOML"},
	} {
		t.Run(c.name, func(t *testing.T) {
			why := loginChange(c.f, []byte(c.was), []byte(c.is))
			if (c.refusedAt == "") != (why == "") || !strings.Contains(why, c.refusedAt) {
				t.Errorf("loginChange = %q, want %q", why, c.refusedAt)
			}
		})
	}
}

// TestCopyLoginsNeverFollows: a job's home a crashed engine planted (its
// login copy a link to a host file, a FIFO) gets its copies as new
// files; the link's target is untouched, and CopyLogins does not block.
func TestCopyLoginsNeverFollows(t *testing.T) {
	host := t.TempDir()
	creds := filepath.Join(host, ".credentials.json")
	os.WriteFile(creds, []byte(claudeLogin), 0o600)
	victim := filepath.Join(host, "victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	j := &Jail{p: Policy{JobDir: t.TempDir()}}
	if err := makeJobDir(j.p); err != nil {
		t.Fatal(err)
	}
	home := j.p.JobHome()
	os.MkdirAll(filepath.Join(home, ".claude"), 0o700)
	os.Symlink(victim, filepath.Join(home, ".claude", ".credentials.json"))
	unix.Mkfifo(filepath.Join(home, "settings.json"), 0o600)
	os.Symlink(host, filepath.Join(home, ".config"))
	files := []LoginFile{
		{Src: creds, Rel: ".claude/.credentials.json", Rotates: true, Refresh: claudeRefresh},
		{Src: creds, Rel: "settings.json"},
		{Src: creds, Rel: ".config/devin.json"},
	}
	done := make(chan error, 1)
	go func() { _, err := j.CopyLogins(files); done <- err }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("CopyLogins did not return")
	}
	if err == nil || !strings.Contains(err.Error(), ".config") {
		t.Errorf("a copy through a linked directory: %v, want refused", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
	if _, err := os.Stat(filepath.Join(host, "devin.json")); err == nil {
		t.Error("a copy landed in the linked directory's target")
	}
	for _, rel := range []string{".claude/.credentials.json", "settings.json"} {
		st, err := os.Lstat(filepath.Join(home, rel))
		if err != nil || !st.Mode().IsRegular() {
			t.Errorf("%s: %v %v, want a regular copy", rel, st, err)
		}
	}
}
