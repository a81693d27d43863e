//go:build unix

package safefs

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// resolutions are the two ways a path is resolved: openat2 where the
// kernel has it, and the O_NOFOLLOW walk (forced).
func resolutions(t *testing.T) map[string]bool {
	t.Helper()
	m := map[string]bool{"walk": true}
	if HasOpenat2() {
		m["openat2"] = false
	} else {
		t.Log("this kernel has no openat2: only the walk is tested")
	}
	return m
}

func openRoot(t *testing.T, dir string, walk bool) *Root {
	t.Helper()
	r, err := OpenRoot("home", dir)
	if err != nil {
		t.Fatal(err)
	}
	r.walk = walk
	t.Cleanup(func() { r.Close() })
	return r
}

// tree is a trusted root with every kind of thing an engine could leave,
// beside a "host" directory outside it holding a secret.
func tree(t *testing.T) (root, secret string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	host := filepath.Join(base, "host")
	for _, d := range []string{root, host, filepath.Join(root, "sub"), filepath.Join(root, "sub", "deeper")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	secret = filepath.Join(host, "hosts.yml")
	os.WriteFile(secret, []byte("oauth_token: gho_secret"), 0o600)
	os.WriteFile(filepath.Join(root, "plain.json"), []byte(`{"ok":true}`), 0o600)
	os.WriteFile(filepath.Join(root, "sub", "deeper", "f"), []byte("deep"), 0o600)
	os.WriteFile(filepath.Join(root, "big"), make([]byte, 2048), 0o600)
	os.Symlink(secret, filepath.Join(root, "link.json"))
	os.Symlink("plain.json", filepath.Join(root, "rel-link"))
	os.Symlink(host, filepath.Join(root, "hostdir"))
	os.Symlink("sub", filepath.Join(root, "sublink"))
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(root, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return root, secret
}

func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	for name, walk := range resolutions(t) {
		t.Run(name, func(t *testing.T) {
			root, _ := tree(t)
			r := openRoot(t, root, walk)
			for _, c := range []struct {
				rel, want, why string
				missing        bool
			}{
				{rel: "plain.json", want: `{"ok":true}`},
				{rel: "sub/deeper/f", want: "deep"},
				{rel: "./sub/../plain.json", want: `{"ok":true}`},
				{rel: "absent", missing: true},
				{rel: "sub/absent", missing: true},
				{rel: "link.json", why: "a symbolic link"},
				{rel: "rel-link", why: "a symbolic link"},
				{rel: "hostdir/hosts.yml", why: "a symbolic link"},
				{rel: "sublink/deeper/f", why: "a symbolic link"},
				{rel: "fifo", why: "a FIFO"},
				{rel: "sock", why: "a socket"},
				{rel: "sub", why: "a directory"},
				{rel: "plain.json/x", why: "a regular file"},
				{rel: "big", why: "larger than the 1 KiB cap"},
				{rel: "../host/hosts.yml", why: "not a path below the tree"},
				{rel: "/etc/passwd", why: "not a path below the tree"},
				{rel: "", why: "not a path below the tree"},
			} {
				done := make(chan struct{})
				var b []byte
				var err error
				go func() { b, err = r.ReadFile(c.rel, 1024); close(done) }()
				select {
				case <-done:
				case <-time.After(time.Minute):
					t.Fatalf("%s: ReadFile did not return (blocked in open or read)", c.rel)
				}
				switch {
				case c.missing:
					if !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s: err %v, want not-exist", c.rel, err)
					}
				case c.why != "":
					ref, ok := AsRefused(err)
					if !ok || ref.Why != c.why || ref.Tree != "home" {
						t.Errorf("%s: got %q, %v; want refused %q", c.rel, b, err, c.why)
					}
					if ok && strings.Contains(ref.Path, "/root/") {
						t.Errorf("%s: refusal path %q is not relative to its tree", c.rel, ref.Path)
					}
				default:
					if err != nil || string(b) != c.want {
						t.Errorf("%s: got %q, %v; want %q", c.rel, b, err, c.want)
					}
				}
			}
		})
	}
}

func TestWriteFileNeverFollowsWhatIsThere(t *testing.T) {
	for name, walk := range resolutions(t) {
		t.Run(name, func(t *testing.T) {
			root, secret := tree(t)
			r := openRoot(t, root, walk)
			for _, rel := range []string{"link.json", "fifo", "sock", "plain.json", "new/dir/login.json", "sub/deeper/f"} {
				if err := r.WriteFile(rel, []byte("copy"), 0o600); err != nil {
					t.Fatalf("%s: %v", rel, err)
				}
				st, err := os.Lstat(filepath.Join(root, rel))
				if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
					t.Errorf("%s: %v, %v: want a regular file 0600", rel, st.Mode(), err)
				}
				if b, _ := os.ReadFile(filepath.Join(root, rel)); string(b) != "copy" {
					t.Errorf("%s holds %q", rel, b)
				}
			}
			if b, _ := os.ReadFile(secret); string(b) != "oauth_token: gho_secret" {
				t.Errorf("the host file behind the link was written: %q", b)
			}
			// A linked directory on the way is refused, not written through.
			for _, rel := range []string{"hostdir/hosts.yml", "sublink/x"} {
				err := r.WriteFile(rel, []byte("copy"), 0o600)
				if _, ok := AsRefused(err); !ok {
					t.Errorf("%s: %v, want a refusal", rel, err)
				}
			}
			if b, _ := os.ReadFile(secret); string(b) != "oauth_token: gho_secret" {
				t.Errorf("the host file behind the linked directory was written: %q", b)
			}
			if _, err := os.Stat(filepath.Join(root, "sub", "x")); err == nil {
				t.Error("a write through the linked directory landed in its target")
			}
		})
	}
}

func TestRemoveRemovesTheEntryNotItsTarget(t *testing.T) {
	for name, walk := range resolutions(t) {
		t.Run(name, func(t *testing.T) {
			root, secret := tree(t)
			r := openRoot(t, root, walk)
			for _, rel := range []string{"link.json", "fifo", "hostdir", "absent", "sub/deeper/f"} {
				if err := r.Remove(rel); err != nil {
					t.Fatalf("%s: %v", rel, err)
				}
				if _, err := os.Lstat(filepath.Join(root, rel)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s is still there (%v)", rel, err)
				}
			}
			if _, err := os.Stat(secret); err != nil {
				t.Errorf("the link's target went too: %v", err)
			}
			if err := r.Remove("sublink/deeper/f"); err == nil {
				t.Error("a remove through a linked directory was not refused")
			}
			if _, err := os.Stat(filepath.Join(root, "sub", "deeper")); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestOpenRootRefusesALinkedRoot(t *testing.T) {
	root, _ := tree(t)
	_, err := OpenRoot("worktree", filepath.Join(root, "hostdir"))
	if _, ok := AsRefused(err); !ok {
		t.Fatalf("OpenRoot of a symbolic link: %v, want a refusal", err)
	}
}
