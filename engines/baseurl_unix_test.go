//go:build unix

package engines

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestBaseURLsFIFO: a settings file that is a FIFO (an open would block
// until someone writes) sets no base URL, and BaseURLs returns.
func TestBaseURLsFIFO(t *testing.T) {
	home := t.TempDir()
	cfg := filepath.Join(home, ".codex", "config.toml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if b := BaseURLs("codex", []string{"HOME=" + home}); len(b) != 0 {
		t.Errorf("a FIFO config.toml: %v", b)
	}
}

// TestEngineSettingsNeverFollowALink: a settings file in the engine's home
// that is a symbolic link to a file elsewhere (the engine's to plant) sets
// no base URL, and codex's login check does not read it (a FIFO there
// would have blocked os.ReadFile).
func TestEngineSettingsNeverFollowALink(t *testing.T) {
	home, elsewhere := t.TempDir(), t.TempDir()
	for _, f := range []struct{ rel, content string }{
		{".claude/settings.json", `{"env":{"ANTHROPIC_BASE_URL":"http://127.0.0.1:4000"}}`},
		{".codex/config.toml", "openai_base_url = \"http://127.0.0.1:5000/v1\"\nmodel_provider = \"gw\"\n"},
	} {
		target := filepath.Join(elsewhere, filepath.Base(f.rel))
		if err := os.WriteFile(target, []byte(f.content), 0o600); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(home, f.rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"HOME=" + home}
	for _, e := range []string{"claude", "codex"} {
		if b := BaseURLs(e, env); len(b) != 0 {
			t.Errorf("%s: a linked settings file set %v", e, b)
		}
	}
	if codexAuthMissing(env) == "" {
		t.Error("codex's login check took a linked config.toml's model_provider for a credential")
	}
	cfg := filepath.Join(home, ".codex", "config.toml")
	os.Remove(cfg)
	if err := syscall.Mkfifo(cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if codexAuthMissing(env) == "" {
		t.Error("codex's login check took a FIFO config.toml for a credential")
	}
}

// TestLoginFilesNeverFollowALink: the login check takes a login file in
// the engine's home for present only as a regular file — a symbolic link
// to one elsewhere, a FIFO or a directory in its place is no login (the
// check followed links with os.Stat).
func TestLoginFilesNeverFollowALink(t *testing.T) {
	for _, c := range []struct {
		engine, rel string
		missing     func([]string) string
	}{
		{"claude", ".claude/.credentials.json", claudeAuthMissing},
		{"codex", ".codex/auth.json", codexAuthMissing},
	} {
		for _, kind := range []string{"file", "link", "fifo", "dir"} {
			t.Run(c.engine+"/"+kind, func(t *testing.T) {
				home := t.TempDir()
				p := filepath.Join(home, c.rel)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				var err error
				switch kind {
				case "file":
					err = os.WriteFile(p, []byte(`{}`), 0o600)
				case "link":
					target := filepath.Join(t.TempDir(), "login.json")
					if err = os.WriteFile(target, []byte(`{}`), 0o600); err == nil {
						err = os.Symlink(target, p)
					}
				case "fifo":
					err = syscall.Mkfifo(p, 0o600)
				case "dir":
					err = os.Mkdir(p, 0o700)
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := c.missing([]string{"HOME=" + home}) == ""; got != (kind == "file") {
					t.Errorf("a %s as %s: login present %v, want %v", kind, c.rel, got, kind == "file")
				}
			})
		}
	}
}
