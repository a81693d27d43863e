// Package caps owns capabilities (docs/manifest.md, "Capability tokens"): what
// this host offers — its OS and architecture, the engines found on PATH and
// the flags they accept, tools, Node's version, the repositories under
// AQ_REPO_BASE and those it can clone — detected once and cached, written as
// tokens (os:linux, engine:claude, has:git, node:20, repo:webapp), and
// matched against what a job requires, with the reason a job cannot run.
package caps
