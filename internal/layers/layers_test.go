package layers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/aqfleet/aq/"

// leaves are the directories (with everything below them) that must not
// import upwards.
var leaves = []string{"job", "engines", "worktree", "profiles", "internal"}

// above are the layers a leaf must never import.
var above = []string{"agent", "cmd", "demo", "selftest", "chaos"}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// upward returns the imports of the Go files below root/dir (tests
// included) that reach into a layer above the leaves, as "file: import".
func upward(t *testing.T, root, dir string) []string {
	t.Helper()
	var bad []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			rest, ok := strings.CutPrefix(p, module)
			if !ok {
				continue
			}
			for _, layer := range above {
				if rest == layer || strings.HasPrefix(rest, layer+"/") {
					rel, _ := filepath.Rel(root, path)
					bad = append(bad, rel+": "+p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

func TestLeavesDoNotImportUpwards(t *testing.T) {
	root := moduleRoot(t)
	for _, leaf := range leaves {
		for _, b := range upward(t, root, leaf) {
			t.Errorf("leaf package imports a layer above it: %s", b)
		}
	}
}

// TestUpwardFindsAnArrow shows the check can fail: a leaf file that
// imports agent/ is reported.
func TestUpwardFindsAnArrow(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module github.com/aqfleet/aq\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "profiles")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := "package profiles\n\nimport (\n\t_ \"github.com/aqfleet/aq/agent/caps\"\n\t_ \"github.com/aqfleet/aq/job\"\n)\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := upward(t, root, "profiles")
	if len(got) != 1 || !strings.HasSuffix(got[0], "github.com/aqfleet/aq/agent/caps") {
		t.Fatalf("upward = %q, want one arrow into agent/caps", got)
	}
}
