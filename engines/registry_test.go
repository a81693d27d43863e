package engines

import (
	"slices"
	"testing"
)

// TestEngineNames: the registry is the one list of engine names — what a
// manifest may name, what is detected on PATH, what `engine: any` tries.
func TestEngineNames(t *testing.T) {
	if got, want := Known(), []string{"claude", "codex", "devin", "script", Any}; !slices.Equal(got, want) {
		t.Errorf("Known() = %v, want %v", got, want)
	}
	if got, want := Coding(), []string{"claude", "codex", "devin"}; !slices.Equal(got, want) {
		t.Errorf("Coding() = %v, want %v", got, want)
	}
	r := NewRegistry(&Script{}, &Codex{})
	if got := r.All(); !slices.Equal(got, []string{"script", "codex"}) {
		t.Errorf("All() = %v, want the order given", got)
	}
	if got := r.Names(); !slices.Equal(got, []string{"codex"}) {
		t.Errorf("Names() = %v: script is never chosen by any", got)
	}
	for _, name := range Known() {
		if _, ok := Default().Get(name); !ok && name != Any {
			t.Errorf("%s is known but not in Default", name)
		}
	}
}
