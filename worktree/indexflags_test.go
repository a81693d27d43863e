package worktree

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestIndexFlagsAsGitSays: the assume-unchanged and skip-worktree bits
// read from real git's index file, in every index version and with both
// object formats, are what `git ls-files -v` says (#35) — and anything
// this reader does not take (a split index, a changed byte, a cut file)
// is an error, for git to read instead.
func TestIndexFlagsAsGitSays(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"sha1", "sha256"} {
		for _, version := range []string{"2", "3", "4"} {
			t.Run(format+"/v"+version, func(t *testing.T) {
				t.Parallel()
				repo := filepath.Join(t.TempDir(), "r")
				if _, err := testenv.GitErr("", "init", "-q", "--object-format="+format, repo); err != nil {
					t.Skipf("git cannot make a %s repository here: %v", format, err)
				}
				var paths []string
				for i := range 40 {
					// Long and shared prefixes: version 4 compresses them.
					p := filepath.Join("dir"+strings.Repeat("x", i%7), "sub", "file-"+strings.Repeat("n", i%13)+string(rune('a'+i%26))+".txt")
					paths = append(paths, filepath.ToSlash(p))
					testenv.WriteFile(t, filepath.Join(repo, p), "x\n")
				}
				testenv.Git(t, repo, "add", "-A")
				testenv.Git(t, repo, "update-index", "--assume-unchanged", paths[1], paths[7], paths[30])
				testenv.Git(t, repo, "update-index", "--skip-worktree", paths[2], paths[7], paths[39])
				testenv.Git(t, repo, "update-index", "--index-version", version)
				data, err := os.ReadFile(filepath.Join(repo, ".git", "index"))
				if err != nil {
					t.Fatal(err)
				}
				hashLen := 20
				if format == "sha256" {
					hashLen = 32
				}
				valid, skip, err := indexFlags(data, hashLen)
				if err != nil {
					t.Fatalf("indexFlags: %v", err)
				}
				var wantValid, wantSkip []string
				for _, rec := range strings.Split(testenv.Git(t, repo, "ls-files", "-v", "-z"), "\x00") {
					if len(rec) < 3 {
						continue
					}
					if rec[0] >= 'a' && rec[0] <= 'z' {
						wantValid = append(wantValid, rec[2:])
					}
					if rec[0] == 'S' || rec[0] == 's' {
						wantSkip = append(wantSkip, rec[2:])
					}
				}
				if got := nulList(valid); !slices.Equal(got, wantValid) {
					t.Errorf("assume-unchanged = %q, git says %q", got, wantValid)
				}
				if got := nulList(skip); !slices.Equal(got, wantSkip) {
					t.Errorf("skip-worktree = %q, git says %q", got, wantSkip)
				}
				if len(wantValid) != 3 || len(wantSkip) != 3 {
					t.Fatalf("the test's bits are not set: %q %q", wantValid, wantSkip)
				}

				// What git alone reads.
				for name, bad := range map[string][]byte{
					"a changed byte":  flip(data, 12+30),
					"cut":             data[:len(data)-hashLen-5],
					"empty":           nil,
					"another version": withVersion(data, 5, hashLen),
					"the other hash":  data,
				} {
					hl := hashLen
					if name == "the other hash" {
						hl = 52 - hashLen
					}
					if _, _, err := indexFlags(bad, hl); !errors.Is(err, errIndexFormat) {
						t.Errorf("%s: err = %v, want errIndexFormat", name, err)
					}
				}
				testenv.Git(t, repo, "update-index", "--split-index")
				split, _ := os.ReadFile(filepath.Join(repo, ".git", "index"))
				if _, _, err := indexFlags(split, hashLen); !errors.Is(err, errIndexFormat) {
					t.Errorf("a split index: err = %v, want errIndexFormat", err)
				}
			})
		}
	}
}

func nulList(b []byte) []string {
	var out []string
	for _, p := range bytes.Split(b, []byte{0}) {
		if len(p) > 0 {
			out = append(out, string(p))
		}
	}
	return out
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x40
	return c
}

// withVersion is data with another version number and a checksum that
// matches, so that only the version is wrong.
func withVersion(data []byte, v byte, hashLen int) []byte {
	c := bytes.Clone(data[:len(data)-hashLen])
	c[7] = v
	return append(c, make([]byte, hashLen)...) // index.skipHash's zero checksum
}
