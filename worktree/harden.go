package worktree

// aq's git never runs what a repository or an engine planted
// (docs/sandbox.md, "aq's own git"). Git executes programs named by its
// configuration — hooks, core.fsmonitor, filter, diff and merge drivers,
// core.sshCommand, credential helpers, core.askPass, remote.*.uploadpack
// and receivepack, … — and redirects traffic by it (url.*.insteadOf,
// http.proxy, core.worktree). A repository's own configuration (the local
// and worktree scopes, and whatever they include) is written by whoever
// can write its .git: an engine, unless a sandbox keeps it out. What the
// factory's operator configured (system and global scopes, git's own
// environment) stays trusted: git-lfs set up by `git lfs install` lives
// there.
//
// So every git aq runs gets, through its environment (never its argv,
// where a trusted value could show in ps or an error message):
//
//   - pins (GIT_CONFIG_COUNT, which git reads after every file and before
//     aq's own -c options) for every key of that kind: the value the
//     trusted scopes give it, else a value that runs nothing. Keys with a
//     fixed name are pinned always, so nothing written to the repository
//     between aq's look at its configuration and git's own read is run
//     either; keys with a name of the repository's choosing (a filter
//     driver's, a remote's, a URL's) are pinned when the repository's
//     configuration names them.
//   - core.hooksPath pinned to a directory that can hold no hook.
//   - for the few keys where the first value wins (remote.*.uploadpack and
//     receivepack; the longest url.*.insteadOf, the first on a tie;
//     core.gitProxy), a configuration file of aq's read in place of the
//     global one (GIT_CONFIG_GLOBAL), which includes the real global
//     configuration first and then aq's values: git reads it before the
//     repository's.
//   - GIT_ALLOW_PROTOCOL (when the host sets none): the transports aq uses,
//     so protocol.*.allow and remote.*.vcs cannot start a remote helper.
//   - GIT_PROXY_COMMAND="" when the trusted scopes set no core.gitProxy.
//   - GIT_WORK_TREE, for a directory that is a worktree's root: a
//     core.worktree cannot point git at another directory.
//
// What the repository configures is read with `git config --list
// --show-scope --show-origin`, which runs nothing, plus the files its
// conditional includes name (read whatever their condition: a pin that
// was not needed costs nothing). The listing is cached per git directory
// and environment (a worktree moved in or out of the pool keeps it; git's
// ceiling directories do not count where the repository is found at the
// directory itself), and reused while none of the files it came from (nor the
// repository's config files and include targets that did not exist)
// changed: inode, size, modification and change time.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// configEntry is one line of `git config --list --show-scope
// --show-origin -z`.
type configEntry struct {
	scope  string // system, global, local, worktree, command
	origin string // the file it was read from (absolute), or ""
	key    string // section and variable lower case, subsection as written
	value  string
	bare   bool // set without a value ("[core] bare"): true for a boolean
}

// trusted reports whether e comes from where the factory's operator
// configures git: the system and global files and git's environment.
func (e configEntry) trusted() bool {
	return e.scope == "system" || e.scope == "global" || e.scope == "command"
}

// parseConfigList reads `git config --list [--show-scope] [--show-origin]
// -z` output (fields NUL-separated; key and value split at the first
// newline; a key without a value has no newline). withScope tells whether
// scope and origin fields are present; relTo resolves relative origins.
func parseConfigList(out []byte, withScope bool, relTo string) []configEntry {
	fields := strings.Split(string(out), "\x00")
	var entries []configEntry
	for i := 0; i < len(fields); {
		var e configEntry
		if withScope {
			if i+2 >= len(fields) {
				break
			}
			e.scope, e.origin = fields[i], fields[i+1]
			i += 2
		}
		if i >= len(fields) || (fields[i] == "" && i == len(fields)-1) {
			break
		}
		kv := fields[i]
		i++
		var hasValue bool
		e.key, e.value, hasValue = strings.Cut(kv, "\n")
		e.bare = !hasValue
		if p, ok := strings.CutPrefix(e.origin, "file:"); ok {
			if !filepath.IsAbs(p) && relTo != "" {
				p = filepath.Join(relTo, p)
			}
			e.origin = p
		} else {
			e.origin = ""
		}
		entries = append(entries, e)
	}
	return entries
}

// splitKey splits "section.sub.section.variable".
func splitKey(k string) (section, sub, variable string) {
	i, j := strings.IndexByte(k, '.'), strings.LastIndexByte(k, '.')
	if i < 0 {
		return k, "", ""
	}
	if i == j {
		return k[:i], "", k[i+1:]
	}
	return k[:i], k[i+1 : j], k[j+1:]
}

// pinSet is what hardening adds to one git run.
type pinSet struct {
	pins  [][2]string // GIT_CONFIG_COUNT entries, in order
	early []string    // lines of aq's early configuration file (none: not needed)
	env   []string    // other variables
}

func (s *pinSet) pin(key, value string) { s.pins = append(s.pins, [2]string{key, value}) }

// hardenInput is what pins are decided on.
type hardenInput struct {
	entries  []configEntry // the listing, plus what conditional includes bring (scope local)
	lookup   func(string) (string, bool)
	dir      string // where git runs (absolute)
	worktree bool   // dir is a worktree's root
	gitBin   string // absolute path of git, for the merge-driver stand-in
	noHooks  string // a hooks directory that holds no hook
	globals  []string
	// gitDir and commonDir, when set, are aq's record of the worktree's
	// git directories (record.go): pinned as GIT_DIR and GIT_COMMON_DIR.
	gitDir, commonDir string
}

// neutralMergeDriver stands in for a merge driver the repository names:
// git's own three-way file merge, as the built-in text driver does it
// (clean: exit 0, the result in %A; conflicts: non-zero).
func neutralMergeDriver(gitBin string) string {
	return shellQuote(gitBin) + " merge-file --marker-size=%L %A %O %B"
}

// planHarden decides the pins for one git run (a pure function: the
// tests table it).
func planHarden(in hardenInput) pinSet {
	var s pinSet
	var trusted, local []configEntry
	for _, e := range in.entries {
		if e.trusted() {
			trusted = append(trusted, e)
		} else {
			local = append(local, e)
		}
	}
	last := func(key string) (string, bool) {
		for i := len(trusted) - 1; i >= 0; i-- {
			if trusted[i].key == key {
				return trusted[i].value, true
			}
		}
		return "", false
	}
	orDefault := func(key, def string) string {
		if v, ok := last(key); ok {
			return v
		}
		return def
	}
	envSet := func(k string) bool { v, ok := in.lookup(k); return ok && v != "" }

	// Always: what has a fixed name.
	s.pin("core.hookspath", in.noHooks)
	s.pin("core.fsmonitor", orDefault("core.fsmonitor", "false"))
	if !envSet("GIT_SSH_COMMAND") {
		def := "ssh"
		if v, ok := in.lookup("GIT_SSH"); ok && v != "" {
			def = shellQuote(v)
		}
		s.pin("core.sshcommand", orDefault("core.sshcommand", def))
	}
	if !envSet("GIT_ASKPASS") {
		def, _ := in.lookup("SSH_ASKPASS")
		s.pin("core.askpass", orDefault("core.askpass", def))
	}
	gpg := orDefault("gpg.program", "gpg")
	for _, e := range trusted { // gpg.program and gpg.openpgp.program are one setting: the last wins
		if e.key == "gpg.program" || e.key == "gpg.openpgp.program" {
			gpg = e.value
		}
	}
	s.pin("gpg.program", gpg)
	s.pin("gpg.openpgp.program", gpg)
	s.pin("gpg.x509.program", orDefault("gpg.x509.program", "gpgsm"))
	s.pin("gpg.ssh.program", orDefault("gpg.ssh.program", "ssh-keygen"))
	// The credential helpers: an empty value empties the list, then the
	// trusted ones again, in their order.
	s.pin("credential.helper", "")
	for _, e := range trusted {
		if sec, _, v := splitKey(e.key); sec == "credential" && v == "helper" {
			s.pin(e.key, e.value)
		}
	}
	if !envSet("GIT_ALLOW_PROTOCOL") {
		allow := []string{"file", "git", "http", "https", "ssh"}
		for _, e := range trusted {
			sec, sub, v := splitKey(e.key)
			if sec == "protocol" && sub != "" && v == "allow" && (e.value == "always" || e.value == "user") && !slices.Contains(allow, sub) {
				allow = append(allow, sub)
			}
		}
		s.env = append(s.env, "GIT_ALLOW_PROTOCOL="+strings.Join(allow, ":"))
	}
	gitProxy := false
	for _, e := range trusted {
		gitProxy = gitProxy || e.key == "core.gitproxy"
	}
	if _, set := in.lookup("GIT_PROXY_COMMAND"); !set && !gitProxy {
		s.env = append(s.env, "GIT_PROXY_COMMAND=")
	}
	if in.worktree {
		s.env = append(s.env, "GIT_WORK_TREE="+in.dir)
	}
	if in.gitDir != "" {
		s.env = append(s.env, "GIT_DIR="+in.gitDir, "GIT_COMMON_DIR="+in.commonDir)
	}

	// What the repository names.
	seen := map[string]bool{}
	var firstWins []string // early-file lines
	resets := map[string]bool{}
	for _, e := range local {
		if seen[e.key] {
			continue
		}
		seen[e.key] = true
		sec, sub, v := splitKey(e.key)
		switch {
		case sec == "filter" && sub != "" && (v == "clean" || v == "smudge" || v == "process"):
			s.pin(e.key, orDefault(e.key, ""))
		case sec == "filter" && sub != "" && v == "required":
			s.pin(e.key, orDefault(e.key, "false"))
		case sec == "diff" && sub != "" && (v == "textconv" || v == "command"):
			s.pin(e.key, orDefault(e.key, ""))
		case e.key == "diff.external":
			s.pin(e.key, orDefault(e.key, ""))
		case sec == "merge" && sub != "" && v == "driver":
			s.pin(e.key, orDefault(e.key, neutralMergeDriver(in.gitBin)))
		case e.key == "core.alternaterefscommand":
			s.pin(e.key, orDefault(e.key, ""))
		case e.key == "gpg.ssh.defaultkeycommand":
			s.pin(e.key, orDefault(e.key, ""))
		case e.key == "submodule.recurse" || e.key == "fetch.recursesubmodules":
			s.pin(e.key, orDefault(e.key, "false"))
		case e.key == "push.recursesubmodules":
			s.pin(e.key, orDefault(e.key, "no"))
		case (sec == "http" && v == "proxy") || (sec == "remote" && sub != "" && v == "proxy"):
			s.pin(e.key, orDefault(e.key, orDefault("http.proxy", envProxy(in.lookup, sub))))
		case sec == "http" && v == "sslverify":
			s.pin(e.key, orDefault(e.key, "true"))
		case sec == "http" && v == "savecookies":
			s.pin(e.key, orDefault(e.key, "false"))
		case sec == "http" && v == "cookiefile":
			s.pin(e.key, orDefault(e.key, ""))
		case sec == "http" && (v == "extraheader" || v == "curloptresolve"):
			// Lists: an empty value empties them; then the trusted ones.
			if !resets[e.key] {
				resets[e.key] = true
				s.pin(e.key, "")
				for _, t := range trusted {
					if t.key == e.key {
						s.pin(t.key, t.value)
					}
				}
			}
		case sec == "remote" && sub != "" && (v == "uploadpack" || v == "receivepack"):
			def := "git-upload-pack"
			if v == "receivepack" {
				def = "git-receive-pack"
			}
			firstWins = append(firstWins, fmt.Sprintf("[remote %s]\n\t%s = %s", quoteSub(sub), v, quoteValue(orDefault(e.key, def))))
		}
	}
	firstWins = append(firstWins, rewritePins(in.entries, trusted, local)...)
	if gitProxy && len(local) > 0 {
		for _, e := range local {
			if e.key == "core.gitproxy" {
				// After the trusted entries (the included globals), before
				// the repository's: git takes the first that matches.
				firstWins = append(firstWins, "[core]\n\tgitProxy = none")
				break
			}
		}
	}
	if len(firstWins) > 0 {
		s.early = append(s.early, "# Written by aq: the global configuration, then what a repository's own may not change (docs/sandbox.md).")
		for _, g := range in.globals {
			s.early = append(s.early, "[include]\n\tpath = "+quoteValue(g))
		}
		s.early = append(s.early, firstWins...)
	}
	return s
}

// envProxy is the proxy the environment gives for a URL like sub (curl's
// variables), for a proxy key the repository set and the trusted scopes
// did not: what git would have used without it.
func envProxy(lookup func(string) (string, bool), sub string) string {
	names := []string{"https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}
	if strings.HasPrefix(strings.ToLower(sub), "http://") {
		names = []string{"http_proxy", "all_proxy", "ALL_PROXY"}
	}
	for _, n := range names {
		if v, ok := lookup(n); ok && v != "" {
			return v
		}
	}
	return ""
}

// rewritePins keep the repository's url.*.insteadOf and pushInsteadOf
// from rewriting its remotes' URLs: for each remote URL a rewrite of the
// repository's applies to, an entry that maps the whole URL to what the
// trusted rewrites alone make of it. Being as long as the URL, it is the
// longest match; read before the repository's (aq's early file), it wins
// a tie too.
func rewritePins(all, trusted, local []configEntry) []string {
	type rewrite struct{ base, prefix string }
	collect := func(entries []configEntry, variable string) []rewrite {
		var out []rewrite
		for _, e := range entries {
			if sec, sub, v := splitKey(e.key); sec == "url" && sub != "" && v == variable {
				out = append(out, rewrite{sub, e.value})
			}
		}
		return out
	}
	// alias is git's alias_url (remote.c): the longest prefix, the first
	// in configuration order on a tie.
	alias := func(u string, rs []rewrite) (string, bool) {
		best := -1
		for i, r := range rs {
			if strings.HasPrefix(u, r.prefix) && (best < 0 || len(r.prefix) > len(rs[best].prefix)) {
				best = i
			}
		}
		if best < 0 {
			return u, false
		}
		return rs[best].base + u[len(rs[best].prefix):], true
	}
	localIn, localPush := collect(local, "insteadof"), collect(local, "pushinsteadof")
	if len(localIn) == 0 && len(localPush) == 0 {
		return nil
	}
	trustedIn, trustedPush := collect(trusted, "insteadof"), collect(trusted, "pushinsteadof")
	var urls, pushURLs []string
	for _, e := range all {
		if sec, sub, v := splitKey(e.key); sec == "remote" && sub != "" && e.value != "" {
			switch v {
			case "url":
				urls = append(urls, e.value)
			case "pushurl":
				pushURLs = append(pushURLs, e.value)
			}
		}
	}
	var lines []string
	done := map[string]bool{}
	add := func(target, variable, u string) {
		if line := fmt.Sprintf("[url %s]\n\t%s = %s", quoteSub(target), variable, quoteValue(u)); !done[line] {
			done[line] = true
			lines = append(lines, line)
		}
	}
	for _, u := range append(slices.Clone(urls), pushURLs...) {
		if _, hit := alias(u, localIn); hit {
			t, _ := alias(u, trustedIn)
			add(t, "insteadOf", u)
		}
	}
	for _, u := range urls {
		if _, hit := alias(u, localPush); hit {
			t, ok := alias(u, trustedPush)
			if !ok {
				t, _ = alias(u, trustedIn)
			}
			add(t, "pushInsteadOf", u)
		}
	}
	return lines
}

// quoteValue writes v as a configuration value.
func quoteValue(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`)
	return `"` + r.Replace(v) + `"`
}

// quoteSub writes a subsection name.
func quoteSub(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// hardenCache remembers the pins of a directory under an environment
// while the configuration files they came from are unchanged.
var hardenCache = struct {
	sync.Mutex
	m map[string]*hardenEntry
}{m: map[string]*hardenEntry{}}

const maxHardenCache = 1024

type hardenEntry struct {
	stamps map[string]configStamp
	// racy holds the content of the files that changed too recently for
	// their stamp to tell a later change apart: those are compared byte
	// for byte (configuration files are small).
	racy map[string][]byte
	// entries is what readConfig found; the first listed are git's own
	// listing (what `git config` itself answers), the rest what the
	// repository's conditional includes would bring whatever their
	// condition (for the pins only).
	entries []configEntry
	listed  int

	mu  sync.Mutex
	env map[string][]string // the pins of each directory (the worktree's own path is pinned)
}

// configStamp tells whether a file changed; zero: the file did not exist.
type configStamp struct {
	fileStamp
	ctime  int64
	exists bool
}

func stampConfig(p string) configStamp {
	fi, err := os.Stat(p)
	if err != nil {
		return configStamp{}
	}
	fs, _ := stampFile(p)
	return configStamp{fileStamp: fs, ctime: ctimeOf(fi), exists: true}
}

// racyWindow: a file changed this recently before it was read may change
// again within the same timestamp; its content is kept and compared.
const racyWindow = time.Second

// HardenedEnv is env (a program's environment) with what keeps the git
// that program runs in dir — gh, which reads the repository's remotes —
// from running what the repository's configuration names, as aq's own git
// is kept (docs/sandbox.md).
func (g Git) HardenedEnv(ctx context.Context, dir string, env []string) ([]string, error) {
	more, err := g.hardenEnv(ctx, dir, env)
	if err != nil {
		return nil, err
	}
	return append(slices.Clip(env), more...), nil
}

// hardenEnv is what hardening adds to the environment of a git run in
// dir whose environment is otherwise env.
func (g Git) hardenEnv(ctx context.Context, dir string, env []string) ([]string, error) {
	entry, h, err := g.configOf(ctx, dir, env)
	if err != nil {
		return nil, err
	}
	entry.mu.Lock()
	out, ok := entry.env[h.abs]
	entry.mu.Unlock()
	if ok {
		return out, nil
	}
	bin, err := g.absBin(h.lookup)
	if err != nil {
		return nil, err
	}
	noHooks, err := g.noHooksDir()
	if err != nil {
		return nil, err
	}
	in := hardenInput{entries: entry.entries, lookup: h.lookup, dir: h.abs, worktree: h.isWorktree, gitBin: bin, noHooks: noHooks, globals: h.globals}
	if h.pinned {
		in.gitDir, in.commonDir = h.gitDir, h.commonDir
	}
	out, err = g.materialize(planHarden(in), env)
	if err != nil {
		return nil, err
	}
	entry.mu.Lock()
	if len(entry.env) < maxHardenCache {
		entry.env[h.abs] = out
	}
	entry.mu.Unlock()
	return out, nil
}

// gitWhere is what configOf found out about a directory.
type gitWhere struct {
	abs                string
	gitDir, commonDir  string
	isWorktree, pinned bool
	lookup             func(string) (string, bool)
	globals            []string
}

// configOf is the repository's configuration as git run in dir with env
// reads it: from the cache while none of the files it came from changed,
// else read again (one `git config --list`). The cache is keyed by the
// git directories, not the directory: a worktree moved in or out of the
// pool keeps its configuration, and so its cache entry.
func (g Git) configOf(ctx context.Context, dir string, env []string) (*hardenEntry, gitWhere, error) {
	abs := dir
	if abs == "" {
		abs = "."
	}
	abs, err := filepath.Abs(abs)
	if err != nil {
		return nil, gitWhere{}, err
	}
	gitDir, commonDir, isWorktree := gitDirs(abs)
	pinned := false
	if x, c, ok := recordedGitDir(abs); ok {
		// aq's record, not the worktree's .git file (record.go).
		gitDir, commonDir, isWorktree, pinned = x, c, true, true
	}
	lookup := envLookup(env)
	h := gitWhere{abs: abs, gitDir: gitDir, commonDir: commonDir, isWorktree: isWorktree, pinned: pinned, lookup: lookup}
	h.globals = globalConfigFiles(lookup)
	// Where no repository is found at dir itself, git searches upwards
	// from it: then dir counts too.
	key := hardenKey(gitDir, commonDir, isWorktree, pinned, env)
	if gitDir == "" {
		key = abs + "\x00" + key
	}
	hardenCache.Lock()
	old, ok := hardenCache.m[key]
	hardenCache.Unlock()
	if ok && old.unchanged() {
		return old, h, nil
	}
	if !ok && isWorktree && gitDir != "" && commonDir != "" && gitDir != commonDir {
		// A linked worktree reads what its repository reads (#35: the
		// pooled worktree's git was the job's second `git config --list`).
		if shared := sharedWithRepo(commonDir, env); shared != nil {
			storeHarden(key, shared)
			return shared, h, nil
		}
	}

	// The files the result depends on are looked at before git reads
	// them (a change while git reads shows at the next command): the
	// repository's config files, the global and system ones, and what the
	// last reading found included.
	start := time.Now()
	entry := &hardenEntry{stamps: map[string]configStamp{}, racy: map[string][]byte{}}
	cacheable := true
	look := func(f string, before bool) {
		if _, seen := entry.stamps[f]; seen {
			return
		}
		st := stampConfig(f)
		entry.stamps[f] = st
		if st.exists && (start.Sub(time.Unix(0, st.mtime)) < racyWindow || start.Sub(time.Unix(0, st.ctime)) < racyWindow) {
			b, err := os.ReadFile(f)
			if err != nil || !before {
				cacheable = false // changed lately, and seen only after git read it
			}
			entry.racy[f] = b
		}
	}
	if commonDir != "" {
		look(filepath.Join(commonDir, "config"), true)
	}
	if gitDir != "" {
		look(filepath.Join(gitDir, "config.worktree"), true)
	}
	for _, f := range h.globals {
		look(f, true)
	}
	if v, ok := lookup("GIT_CONFIG_SYSTEM"); ok && v != "" {
		look(v, true)
	} else {
		look("/etc/gitconfig", true)
	}
	if ok {
		for f := range old.stamps {
			look(f, true)
		}
	}
	readEnv := env
	if pinned {
		readEnv = append(slices.Clip(env), "GIT_DIR="+gitDir, "GIT_COMMON_DIR="+commonDir, "GIT_WORK_TREE="+abs)
	}
	entries, listed, files, err := g.readConfig(ctx, abs, readEnv)
	if err != nil {
		return nil, gitWhere{}, err
	}
	for _, f := range files {
		look(f, false)
	}
	entry.entries, entry.listed, entry.env = entries, listed, map[string][]string{}
	if cacheable {
		storeHarden(key, entry)
	}
	return entry, h, nil
}

// hardenKey is the configuration cache's key: what git reads depends on the
// git directories and the environment, not on where the worktree sits.
func hardenKey(gitDir, commonDir string, isWorktree, pinned bool, env []string) string {
	return gitDir + "\x00" + commonDir + "\x00" + strconv.FormatBool(isWorktree) + strconv.FormatBool(pinned) + "\x00" + relevantEnv(env, gitDir != "")
}

// storeHarden caches e under key (the cache starts afresh when full).
func storeHarden(key string, e *hardenEntry) {
	hardenCache.Lock()
	defer hardenCache.Unlock()
	if len(hardenCache.m) >= maxHardenCache {
		hardenCache.m = map[string]*hardenEntry{}
	}
	hardenCache.m[key] = e
}

// sharedWithRepo is the cached configuration of the repository whose
// common git directory is commonDir, read under env, as a new entry for
// one of its linked worktrees — when git reads exactly the same there: no
// extensions.worktreeConfig (so no config.worktree is read), and no include
// of any scope (an includeIf's gitdir: and onbranch: conditions are the
// worktree's own). nil when there is no such entry, or it is stale.
func sharedWithRepo(commonDir string, env []string) *hardenEntry {
	var repo *hardenEntry
	hardenCache.Lock()
	for _, checkout := range []bool{true, false} { // a checkout's .git, or a bare repository
		if e, ok := hardenCache.m[hardenKey(commonDir, commonDir, checkout, false, env)]; ok {
			repo = e
			break
		}
	}
	hardenCache.Unlock()
	if repo == nil || !repo.unchanged() {
		return nil
	}
	for _, e := range repo.entries {
		sec, _, v := splitKey(e.key)
		if sec == "include" || sec == "includeif" || e.scope == "worktree" || (sec == "extensions" && v == "worktreeconfig") {
			return nil
		}
	}
	return &hardenEntry{stamps: maps.Clone(repo.stamps), racy: maps.Clone(repo.racy), entries: repo.entries, listed: repo.listed, env: map[string][]string{}}
}

// unchanged reports whether every file e was worked out from is as it was.
func (e *hardenEntry) unchanged() bool {
	for f, st := range e.stamps {
		if stampConfig(f) != st {
			return false
		}
	}
	for f, b := range e.racy {
		now, err := os.ReadFile(f)
		if err != nil || !bytes.Equal(now, b) {
			return false
		}
	}
	return true
}

// relevantEnv is the part of env that hardening's result depends on: what
// decides which configuration git reads and what it would run. (Not, say,
// GIT_INDEX_FILE, which a checkpoint sets to a fresh file each time.)
//
// Each variable counts once, with its last value (as exec passes it on).
// found says the repository is found where git starts (dir is a
// repository's root or git directory, or aq names the git directory):
// then GIT_CEILING_DIRECTORIES, which only bounds the search upwards,
// cannot change what git reads, and is left out — `git -C repo` and the
// same git with a ceiling above repo read the same configuration (#35:
// the two read it twice).
func relevantEnv(env []string, found bool) string {
	last := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if found && k == "GIT_CEILING_DIRECTORIES" {
			continue
		}
		if strings.HasPrefix(k, "GIT_CONFIG") || relevantVars[k] || strings.HasSuffix(strings.ToLower(k), "_proxy") {
			last[k] = v
		}
	}
	keys := make([]string, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + last[k])
		b.WriteByte(0)
	}
	return b.String()
}

var relevantVars = map[string]bool{
	"HOME": true, "XDG_CONFIG_HOME": true, "SSH_ASKPASS": true, "GIT_ASKPASS": true, "GIT_SSH": true, "GIT_SSH_COMMAND": true,
	"GIT_ALLOW_PROTOCOL": true, "GIT_PROXY_COMMAND": true, "GIT_CEILING_DIRECTORIES": true, "GIT_DISCOVERY_ACROSS_FILESYSTEM": true,
	"GIT_DIR": true, "GIT_COMMON_DIR": true, "GIT_WORK_TREE": true, "PATH": true,
}

// envLookup looks a variable up in env (the last value wins, as exec's).
func envLookup(env []string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- {
			if v, ok := strings.CutPrefix(env[i], k+"="); ok {
				return v, true
			}
		}
		return "", false
	}
}

// configReads counts readConfig's runs (for tests and benchmarks: a cached
// result reads nothing).
var configReads atomic.Int64

// readConfig lists dir's configuration and what its conditional includes
// bring, and names every file read.
func (g Git) readConfig(ctx context.Context, dir string, env []string) (entries []configEntry, listed int, files []string, err error) {
	configReads.Add(1)
	out, err := g.rawConfig(ctx, dir, env, "config", "--list", "--show-scope", "--show-origin", "-z")
	if err != nil {
		return nil, 0, nil, err
	}
	entries = parseConfigList(out, true, dir)
	listed = len(entries)
	for _, e := range entries {
		if e.origin != "" && !slices.Contains(files, e.origin) {
			files = append(files, e.origin)
		}
	}
	// Conditional includes of the repository's, read whatever their
	// condition (one that is false now may be true for the next command:
	// onbranch:). Nested includes likewise, to git's own depth.
	type todo struct {
		path  string
		depth int
	}
	var queue []todo
	enqueue := func(list []configEntry, depth int) {
		for _, e := range list {
			if e.trusted() {
				continue
			}
			if sec, _, v := splitKey(e.key); (sec == "include" || sec == "includeif") && v == "path" && e.value != "" {
				queue = append(queue, todo{includeTarget(e.value, e.origin, dir), depth})
			}
		}
	}
	enqueue(entries, 1)
	read := map[string]bool{}
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		if t.path == "" || read[t.path] || t.depth > 10 {
			continue
		}
		read[t.path] = true
		files = append(files, t.path)
		if _, err := os.Stat(t.path); err != nil {
			continue // not there (yet): its stamp says when it appears
		}
		out, err := g.rawConfig(ctx, dir, env, "config", "--no-includes", "--file", t.path, "--list", "-z")
		if err != nil {
			continue // unreadable or malformed: git itself skips or fails on it
		}
		more := parseConfigList(out, false, "")
		for i := range more {
			more[i].scope, more[i].origin = "local", t.path
		}
		entries = append(entries, more...)
		enqueue(more, t.depth+1)
	}
	return entries, listed, files, nil
}

// includeTarget resolves an include's path as git does: ~ is the home
// directory, a relative path is relative to the including file's folder.
func includeTarget(p, from, dir string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		return filepath.Join(home, rest)
	}
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	base := dir
	if from != "" {
		base = filepath.Dir(from)
	}
	return filepath.Join(base, p)
}

// rawConfig runs `git config` without hardening: it executes nothing.
func (g Git) rawConfig(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	bin := g.Bin
	if bin == "" {
		bin = "git"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &GitError{Args: args, Dir: dir, ExitCode: exitCode(err), Stderr: stderr.String(), Err: err}
	}
	return out, nil
}

// gitDirs finds dir's git directory and common directory from the file
// system: a checkout's .git folder, a linked worktree's .git file, or a
// bare repository. worktree is true when dir is a worktree's root.
func gitDirs(dir string) (gitDir, commonDir string, worktree bool) {
	dotgit := filepath.Join(dir, ".git")
	fi, err := os.Stat(dotgit)
	switch {
	case err == nil && fi.IsDir():
		return dotgit, dotgit, true
	case err == nil && fi.Mode().IsRegular():
		b, err := os.ReadFile(dotgit)
		if err != nil {
			return "", "", true
		}
		target, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir:")
		if !ok {
			return "", "", true
		}
		target = strings.TrimSpace(target)
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		common := target
		if c, err := os.ReadFile(filepath.Join(target, "commondir")); err == nil {
			common = strings.TrimSpace(string(c))
			if !filepath.IsAbs(common) {
				common = filepath.Join(target, common)
			}
		}
		return target, filepath.Clean(common), true
	case isGitDir(dir):
		return dir, dir, false
	}
	return "", "", false
}

// globalConfigFiles are the files git reads as the global configuration,
// in its order.
func globalConfigFiles(lookup func(string) (string, bool)) []string {
	if v, ok := lookup("GIT_CONFIG_GLOBAL"); ok {
		if v == "" {
			return nil
		}
		return []string{v}
	}
	home, _ := lookup("HOME")
	xdg, _ := lookup("XDG_CONFIG_HOME")
	if xdg == "" && home != "" {
		xdg = filepath.Join(home, ".config")
	}
	var files []string
	if xdg != "" {
		files = append(files, filepath.Join(xdg, "git", "config"))
	}
	if home != "" {
		files = append(files, filepath.Join(home, ".gitconfig"))
	}
	return files
}

// absBin is git's absolute path, for the merge-driver stand-in.
func (g Git) absBin(lookup func(string) (string, bool)) (string, error) {
	bin := g.Bin
	if bin == "" {
		bin = "git"
	}
	if filepath.IsAbs(bin) {
		return bin, nil
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}

// configDir is where aq writes its early configuration files.
func (g Git) configDir() (string, error) {
	if g.ConfigDir != "" {
		return g.ConfigDir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no folder for aq's git configuration (set Git.ConfigDir): %w", err)
	}
	return filepath.Join(base, "aq", "git"), nil
}

// materialize turns a plan into environment entries: the pins after any
// GIT_CONFIG_COUNT entries env has, the early file written (once: it is
// named by its content) and named by GIT_CONFIG_GLOBAL.
func (g Git) materialize(s pinSet, env []string) ([]string, error) {
	lookup := envLookup(env)
	base := 0
	if v, ok := lookup("GIT_CONFIG_COUNT"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("GIT_CONFIG_COUNT=%q is not a count", v)
		}
		base = n
	}
	out := make([]string, 0, 2*len(s.pins)+len(s.env)+2)
	for i, p := range s.pins {
		n := strconv.Itoa(base + i)
		out = append(out, "GIT_CONFIG_KEY_"+n+"="+p[0], "GIT_CONFIG_VALUE_"+n+"="+p[1])
	}
	out = append(out, "GIT_CONFIG_COUNT="+strconv.Itoa(base+len(s.pins)))
	out = append(out, s.env...)
	if len(s.early) > 0 {
		path, err := g.writeEarly([]byte(strings.Join(s.early, "\n") + "\n"))
		if err != nil {
			return nil, err
		}
		out = append(out, "GIT_CONFIG_GLOBAL="+path)
	}
	return out, nil
}

// writeEarly writes an early configuration file, named by its content, in
// a folder of the user's own.
func (g Git) writeEarly(content []byte) (string, error) {
	dir, err := g.configDir()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(content)
	path := filepath.Join(dir, "early-"+hex.EncodeToString(sum[:12])+".gitconfig")
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, content) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("aq's git configuration: %w", err)
	}
	f, err := os.CreateTemp(dir, ".early-*")
	if err != nil {
		return "", fmt.Errorf("aq's git configuration: %w", err)
	}
	_, werr := f.Write(content)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("aq's git configuration: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("aq's git configuration: %w", err)
	}
	return path, nil
}

// listing is git's own listing of dir's configuration (what `git config
// --list` run there answers, all scopes), from the cache hardening keeps
// (hardenEnv: read once while none of the files changed). ok is false when
// g runs git unhardened (no cache): the caller asks git.
func (g Git) listing(ctx context.Context, dir string) (entries []configEntry, ok bool, err error) {
	if g.unhardened {
		return nil, false, nil
	}
	gd := g.at(dir)
	entry, _, err := gd.configOf(ctx, dir, gd.environ(nil))
	if err != nil {
		return nil, false, err
	}
	return entry.entries[:entry.listed], true, nil
}

// ConfigGet answers as `git config --get-regexp '^(k1|k2|…)$'` run in dir
// would, for the keys named (lower case, as git names them: "user.name"):
// one "key value" line per value, in git's order, "key" alone for a key
// set without a value; "" when none is set. It reads the cached listing
// (listing), not a git of its own: a job's commits ask for their identity
// without a process each (#35).
func (g Git) ConfigGet(ctx context.Context, dir string, keys ...string) (string, error) {
	entries, ok, err := g.listing(ctx, dir)
	if err != nil {
		return "", err
	}
	if !ok {
		quoted := make([]string, len(keys))
		for i, k := range keys {
			quoted[i] = regexpQuote(k)
		}
		out, err := g.at(dir).Run(ctx, dir, "config", "--get-regexp", "^("+strings.Join(quoted, "|")+")$")
		if exitCode(err) == 1 {
			return "", nil
		}
		return out, err
	}
	var lines []string
	for _, e := range entries {
		if slices.Contains(keys, e.key) {
			if e.bare {
				lines = append(lines, e.key)
			} else {
				lines = append(lines, e.key+" "+e.value)
			}
		}
	}
	return strings.Join(lines, "\n"), nil
}

// regexpQuote escapes the dots of a configuration key for a git regexp.
func regexpQuote(k string) string { return strings.ReplaceAll(k, ".", `\.`) }
