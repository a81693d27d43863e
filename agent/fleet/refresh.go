package fleet

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/caps"
)

// Refresher keeps what a long-running factory offers current (#17 item 5):
// engines and their versions, tools, node, and the repos under
// AQ_REPO_BASE — a new clone, a removed one. It re-detects every Every
// (AQ_CAPS_REFRESH) and, between, at once when the repo base changed: each
// Check stats the base (its mtime moves when an entry directly below is
// added, removed or renamed) and the few directories below it that were not
// repositories at the last detection (a clone in progress becomes one). A
// detection whose offer differs is handed to the client, so the next
// heartbeat and the next claim carry it; Changed is told (the daemon beats
// at once). Version probes of unchanged binaries come from the probe cache
// the Detect function uses.
//
// The heartbeat checks before each beat, the poll path before each claim,
// the broker path before each accept. Safe for concurrent use: one
// detection at a time; a Check that finds one running uses the offer as it
// is.
type Refresher struct {
	Client *Client
	// Detect finds the host's capabilities (caps.Detect with the
	// configuration's repo base, clonable repos and probe cache).
	Detect   func(ctx context.Context) (*caps.Host, error)
	RepoBase string
	// Every is the cadence (AQ_CAPS_REFRESH); 0 turns refreshing off: the
	// offer stays what Start detected.
	Every   time.Duration
	Clock   Clock
	Log     *slog.Logger
	Changed func()

	mu      sync.Mutex
	host    *caps.Host
	at      time.Time      // the last detection
	stamp   caps.BaseStamp // the base as that detection found it
	pending []string       // directories under the base that were no repository then
	offered map[string]bool
	running bool
	failed  bool // the last detection failed (said once)
}

// Start records the host detected at start-up (the offer the client has).
func (r *Refresher) Start(h *caps.Host) {
	stamp, _ := caps.StatBase(r.RepoBase)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set(h, stamp, r.now())
}

func (r *Refresher) set(h *caps.Host, stamp caps.BaseStamp, at time.Time) {
	r.host, r.stamp, r.at = h, stamp, at
	r.pending = nonRepos(r.RepoBase, h)
	if r.offered == nil {
		r.offered = map[string]bool{}
	}
	for _, t := range h.Tokens() {
		r.offered[t] = true
	}
}

// Host is the host as last detected.
func (r *Refresher) Host() *caps.Host {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.host
}

// Check re-detects when the cadence is due or the repo base changed, and
// reports whether the offer changed. Off (Every 0), or before Start, it does
// nothing.
func (r *Refresher) Check(ctx context.Context) bool {
	if r == nil || r.Every <= 0 {
		return false
	}
	r.mu.Lock()
	if r.host == nil || r.running {
		r.mu.Unlock()
		return false
	}
	now := r.now()
	due := now.Sub(r.at) >= r.Every
	old, pending := r.stamp, r.pending
	r.mu.Unlock()
	stamp, err := caps.StatBase(r.RepoBase)
	why := "cadence"
	switch {
	case due:
	case err == nil && stamp != old:
		why = "repo base changed"
	case pendingBecameRepo(r.RepoBase, pending):
		why = "a directory under the repo base became a repository"
	default:
		return false
	}
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return false
	}
	r.running = true
	prev := r.host
	r.mu.Unlock()

	h, derr := r.Detect(ctx)

	r.mu.Lock()
	r.running = false
	if derr != nil {
		// Keep the offer; try again at the next cadence or change (not at
		// every beat: the base may stay unreadable for a while).
		r.at, r.stamp = now, stamp
		first := !r.failed
		r.failed = true
		r.mu.Unlock()
		if first && ctx.Err() == nil {
			r.log().Warn("capability refresh failed; the offer stays as it was", "err", derr)
		}
		return false
	}
	r.failed = false
	r.set(h, stamp, now)
	r.mu.Unlock()

	added, removed := diffTokens(prev.Tokens(), h.Tokens())
	if len(added) == 0 && len(removed) == 0 {
		r.log().Debug("capabilities re-detected: no change", "why", why)
		return false
	}
	r.Client.SetOffer(h.Tokens(), h.Repos)
	r.log().Info("capabilities changed; the next heartbeat carries them", "why", why, "added", added, "removed", removed)
	if r.Changed != nil {
		r.Changed()
	}
	return true
}

// Lost reports whether token was offered since start and is not offered
// now (a repo removed, an engine uninstalled).
func (r *Refresher) Lost(token string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.offered[token] || r.host == nil {
		return false
	}
	return !slices.Contains(r.host.Tokens(), token)
}

// Unfit says why a job needing caps (its declared capabilities) on repo
// cannot run here any more ("" when it can): a declared capability this
// host does not offer now, or its repo if this factory offered it before
// and no longer does (a job on a repo never offered may name a URL to clone
// it from). It checks first (a removal a moment ago counts).
func (r *Refresher) Unfit(ctx context.Context, need []string, repo string) string {
	if r == nil {
		return ""
	}
	r.Check(ctx)
	h := r.Host()
	if h == nil {
		return ""
	}
	var why []string
	for _, m := range caps.Match(need, h) {
		why = append(why, m.Token)
	}
	if repo != "" && r.Lost("repo:"+repo) {
		why = append(why, "repo:"+repo)
	}
	if len(why) == 0 {
		return ""
	}
	return "this factory does not offer " + strings.Join(why, ", ") + " (any more)"
}

func (r *Refresher) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return time.Now()
}

func (r *Refresher) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

// nonRepos are the visible directories under base that h does not list as
// repositories (a clone in progress, a plain folder): the next checks look
// at them, a cheap stat each.
func nonRepos(base string, h *caps.Host) []string {
	if base == "" {
		return nil
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !caps.ValidRepoName(n) || slices.Contains(h.Repos, n) {
			continue // hidden, never offered, or a repository already
		}
		if e.IsDir() || e.Type()&os.ModeSymlink != 0 {
			out = append(out, n)
		}
	}
	return out
}

// pendingBecameRepo reports whether one of the directories is a repository
// now (detection's own test: a broken .git does not count, so it cannot
// trigger a detection at every check).
func pendingBecameRepo(base string, pending []string) bool {
	for _, n := range pending {
		if caps.IsGitCheckout(filepath.Join(base, n)) {
			return true
		}
	}
	return false
}

// diffTokens is what b adds to a and what it drops.
func diffTokens(a, b []string) (added, removed []string) {
	for _, t := range b {
		if !slices.Contains(a, t) {
			added = append(added, t)
		}
	}
	for _, t := range a {
		if !slices.Contains(b, t) {
			removed = append(removed, t)
		}
	}
	return added, removed
}
