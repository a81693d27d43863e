package engines

// Registry holds the engines aq knows, by name.
type Registry struct {
	byName map[string]Engine
	anyOf  []string
}

var _ interface {
	Get(string) (Engine, bool)
	Names() []string
} = (*Registry)(nil)

// NewRegistry returns a registry of the given engines. `engine: any` tries
// the coding engines in the order given (script is never chosen by any: it
// needs a script: command).
func NewRegistry(es ...Engine) *Registry {
	r := &Registry{byName: map[string]Engine{}}
	for _, e := range es {
		r.byName[e.Name()] = e
		if e.Name() != "script" {
			r.anyOf = append(r.anyOf, e.Name())
		}
	}
	return r
}

// Default is every engine aq ships: claude, codex and devin (the order
// `engine: any` tries them in), and script; their --help probes are not
// cached (DefaultWith).
func Default() *Registry { return DefaultWith(nil) }

// DefaultWith is Default with the coding engines' --help probes cached in
// probes.
func DefaultWith(probes *ProbeCache) *Registry {
	return NewRegistry(&Claude{Probes: probes}, &Codex{Probes: probes}, &Devin{Probes: probes}, &Script{})
}

// Get returns the engine called name.
func (r *Registry) Get(name string) (Engine, bool) {
	e, ok := r.byName[name]
	return e, ok
}

// Names lists the engines `engine: any` may use, in order of preference.
func (r *Registry) Names() []string { return append([]string(nil), r.anyOf...) }
