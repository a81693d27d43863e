package layers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const module = "github.com/aqfleet/aq/"

// layering is the depguard rule "leaves" of .golangci.yml: the leaf
// directories (its file globs, "**/job/**") and the packages they must not
// import (its deny list).
type layering struct {
	leaves []string // directories, with everything below them
	above  []string // module-relative package paths
}

func readLayering(t *testing.T, root string) layering {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".golangci.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Linters struct {
			Settings struct {
				Depguard struct {
					Rules map[string]struct {
						Files []string
						Deny  []struct{ Pkg string }
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf(".golangci.yml: %v", err)
	}
	rule, ok := cfg.Linters.Settings.Depguard.Rules["leaves"]
	if !ok || len(rule.Files) == 0 || len(rule.Deny) == 0 {
		t.Fatal(`.golangci.yml has no depguard rule "leaves" with files and a deny list`)
	}
	var l layering
	for _, g := range rule.Files {
		dir, ok := strings.CutPrefix(g, "**/")
		dir, ok2 := strings.CutSuffix(dir, "/**")
		if !ok || !ok2 || strings.Contains(dir, "*") {
			t.Fatalf(`depguard rule "leaves": file glob %q is not "**/<dir>/**"`, g)
		}
		l.leaves = append(l.leaves, dir)
	}
	for _, d := range rule.Deny {
		rest, ok := strings.CutPrefix(d.Pkg, module)
		if !ok {
			t.Fatalf(`depguard rule "leaves": %q is not a package of %s`, d.Pkg, module)
		}
		l.above = append(l.above, rest)
	}
	return l
}

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
func upward(t *testing.T, root, dir string, above []string) []string {
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
	l := readLayering(t, root)
	for _, want := range []string{"job", "engines", "worktree", "profiles", "internal"} {
		if !slices.Contains(l.leaves, want) {
			t.Errorf("the depguard rule no longer names %s a leaf", want)
		}
	}
	for _, leaf := range l.leaves {
		for _, b := range upward(t, root, leaf, l.above) {
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
	got := upward(t, root, "profiles", readLayering(t, moduleRoot(t)).above)
	if len(got) != 1 || !strings.HasSuffix(got[0], "github.com/aqfleet/aq/agent/caps") {
		t.Fatalf("upward = %q, want one arrow into agent/caps", got)
	}
}
