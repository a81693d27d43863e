package engines

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// An API that does not answer — a gateway with nothing listening, a proxy
// that cannot reach it, DNS that does not resolve it, a vendor's outage —
// shows in the engines' own retry events long before their own patience
// ends (claude retries ten times over about three minutes; codex
// reconnects without end, "waiting for network"). aq reads "no progress"
// from those events, not from a timer: DefaultMaxAPIRetries of them with
// no answer of the API between (an assistant message with usage, a
// completed turn) stop the run, Unavailable, with a detail naming where
// the engine was calling (docs/engines.md, "An unreachable API").

// DefaultMaxAPIRetries is how many of an engine's retry events in a row,
// with no answer of its API between, stop a run.
const DefaultMaxAPIRetries = 5

// errNoProgress is the stop cause of a run stopped for making no API
// progress.
var errNoProgress = errors.New("the engine made no API progress")

// noProgress counts an engine's retry events since its API last answered.
// The parser's lock guards it.
type noProgress struct {
	max      int
	n        int
	last     string
	endpoint string      // where the engine calls, for the detail
	abort    func(error) // stops the run (nil: never, e.g. a recorded stream)
	stalled  string      // the detail, once it stopped the run
}

// watch arms the counter: stop the run with abort after max retry events
// without progress (max <= 0: DefaultMaxAPIRetries).
func (w *noProgress) watch(max int, endpoint string, abort func(error)) {
	if max <= 0 {
		max = DefaultMaxAPIRetries
	}
	w.max, w.endpoint, w.abort = max, endpoint, abort
}

// retry counts one retry event (what: the engine's words for it); it
// reports whether the run is to stop now (the caller calls abort outside
// its lock).
func (w *noProgress) retry(engine, event, what string) bool {
	w.n++
	w.last = what
	if w.abort == nil || w.stalled != "" || w.n < w.max {
		return false
	}
	w.stalled = fmt.Sprintf("%s made no API progress: %d %s events in a row without an answer, calling %s (last: %s)",
		engine, w.n, event, w.endpoint, orNone(what))
	return true
}

// progress says the API answered.
func (w *noProgress) progress() { w.n = 0 }

// stop stops the run, once (call it without the parser's lock).
func (w *noProgress) stop() {
	if w.abort != nil {
		w.abort(errNoProgress)
	}
}

// apiEndpoint names where engine calls its API, for messages: its base URL
// and the setting it came from (engines.BaseURLs, in env: the engine's own
// environment and home), else the vendor's API.
func apiEndpoint(engine string, env []string) string {
	for _, b := range effectiveBaseURLs(engine, env) {
		return b.Redacted() + " (" + b.Where() + ")"
	}
	switch engine {
	case "claude":
		return "the Anthropic API"
	case "codex":
		return "the OpenAI API"
	}
	return "its API"
}

// Endpoint is the base URL engine calls first (see effectiveBaseURLs),
// false when it calls its vendor's API.
func Endpoint(engine string, env []string) (BaseURL, bool) {
	if b := effectiveBaseURLs(engine, env); len(b) > 0 {
		return b[0], true
	}
	return BaseURL{}, false
}

// effectiveBaseURLs are the base URLs an engine calls first: claude
// applies its settings.json env over its environment; codex takes
// OPENAI_BASE_URL over config.toml's openai_base_url.
func effectiveBaseURLs(engine string, env []string) []BaseURL {
	all := BaseURLs(engine, env)
	var out []BaseURL
	for _, b := range all {
		if b.Check() != nil {
			continue
		}
		switch {
		case engine == "claude" && b.From != "":
			out = append([]BaseURL{b}, out...)
		case engine == "codex" && strings.HasPrefix(b.Var, "model_providers."):
			// a provider's URL is used only when the config selects it
		default:
			out = append(out, b)
		}
	}
	return out
}

// EgressRefusal is a refusal of aq's egress proxy that an engine quoted
// in its error: the proxy signs its answers ("aq egress proxy: host:port
// refused: why", X-Aq-Egress: refused), so a 403 of the proxy is not taken
// for the API refusing the engine's login.
type EgressRefusal struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	Why  string `json:"why"`
}

// egressRefusedRE is the proxy's refusal line (internal/egress
// writeRefusal).
var egressRefusedRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`aq egress proxy: (\S+) refused: (.*?)(?: \(docs/sandbox\.md, Network\)|$)`)
})

// egressRefusal finds the proxy's refusal in what an engine printed.
func egressRefusal(texts ...string) (*EgressRefusal, bool) {
	for _, t := range texts {
		for _, line := range strings.Split(t, "\n") {
			m := egressRefusedRE().FindStringSubmatch(line)
			if m == nil {
				continue
			}
			host, port, err := net.SplitHostPort(m[1])
			if err != nil {
				continue
			}
			n, _ := strconv.Atoi(port)
			return &EgressRefusal{Host: host, Port: n, Why: strings.TrimSpace(m[2])}, true
		}
	}
	return nil, false
}

// refusedDetail is a run's detail when the proxy refused its API.
func refusedDetail(engine string, r *EgressRefusal) string {
	return fmt.Sprintf("%s could not reach its API: the job's egress proxy refused %s: %s (docs/sandbox.md, Network)",
		engine, net.JoinHostPort(r.Host, strconv.Itoa(r.Port)), orNone(r.Why))
}

// kindEgressRefused is the unavailable kind of an API call the job's
// egress proxy refused.
const kindEgressRefused = "egress refused"
