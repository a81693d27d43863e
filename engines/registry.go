package engines

import "time"

// Registry holds the engines aq knows, by name.
type Registry struct {
	byName map[string]Engine
	all    []string
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
		r.all = append(r.all, e.Name())
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
	return DefaultProbing(probes, 0)
}

// DefaultProbing is DefaultWith with each --version and --help probe
// bounded by timeout (AQ_ENGINE_PROBE_TIMEOUT; 0: DefaultVersionTimeout and
// DefaultHelpTimeout).
func DefaultProbing(probes *ProbeCache, timeout time.Duration) *Registry {
	return NewRegistry(&Claude{Probes: probes, VersionTimeout: timeout, HelpTimeout: timeout},
		&Codex{Probes: probes, VersionTimeout: timeout, HelpTimeout: timeout},
		&Devin{Probes: probes, VersionTimeout: timeout, HelpTimeout: timeout}, &Script{})
}

// Get returns the engine called name.
func (r *Registry) Get(name string) (Engine, bool) {
	e, ok := r.byName[name]
	return e, ok
}

// Names lists the engines `engine: any` may use, in order of preference.
func (r *Registry) Names() []string { return append([]string(nil), r.anyOf...) }

// All lists every engine of the registry by name, in the order given.
func (r *Registry) All() []string { return append([]string(nil), r.all...) }

// Any is the engine a job names to let aq choose among the coding engines.
const Any = "any"

// Known lists the engine names a manifest or a profile may give: every
// engine aq ships (Default), then Any. It is the one list of engine names:
// validation, capability detection and the stub's scheduler read it.
func Known() []string { return append(Default().All(), Any) }

// Coding lists the coding engines aq ships, found by their binary on PATH,
// in the order `engine: any` tries them.
func Coding() []string { return Default().Names() }
