// Package secrets owns what aq treats as secret: which environment variables
// carry secrets, how to strip them from an engine's environment, and how to
// mask their values in anything aq writes (logs, job logs, errors).
//
// It is a leaf package: config, the process layer and the loggers all use it,
// so that "what is a secret" is decided in exactly one place.
package secrets

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Mask is what a secret value is replaced with.
const Mask = "***"

// aqSecretEnv are the factory's own credentials, whatever their names end
// in: masked in logs (IsSecretName) and never passed to an engine
// (IsAQSecret).
var aqSecretEnv = map[string]bool{
	"AQ_FLEET_TOKEN":          true,
	"AQ_SB_CONNECTION_STRING": true,
	"AQ_ENROLL_TOKEN":         true,
	// The factory's Azure identity (azidentity's DefaultAzureCredential reads
	// these for Service Bus): the host's identity is the fleet's, never an
	// engine's. Non-secret ids (AZURE_CLIENT_ID, AZURE_TENANT_ID) stay.
	"AZURE_CLIENT_SECRET":               true,
	"AZURE_CLIENT_CERTIFICATE_PASSWORD": true,
	"AZURE_CLIENT_CERTIFICATE_PATH":     true,
	"AZURE_PASSWORD":                    true,
	"AZURE_FEDERATED_TOKEN_FILE":        true,
	"IDENTITY_HEADER":                   true,
	"MSI_SECRET":                        true,
	// The notification webhook often carries its token in the URL.
	"AQ_NOTIFY_URL": true,
	// The OTLP exporter's credentials (headers such as Authorization, the
	// client key for mTLS) are aq's: an engine exporting telemetry of its
	// own (AQ_CLAUDE_TELEMETRY) gets the endpoint, never these.
	"OTEL_EXPORTER_OTLP_HEADERS":           true,
	"OTEL_EXPORTER_OTLP_TRACES_HEADERS":    true,
	"OTEL_EXPORTER_OTLP_METRICS_HEADERS":   true,
	"OTEL_EXPORTER_OTLP_LOGS_HEADERS":      true,
	"OTEL_EXPORTER_OTLP_CLIENT_KEY":        true,
	"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": true,
}

// secretSuffixes mark any environment variable as secret by name (docs/fleet.md, "Artifacts": what is masked).
var secretSuffixes = []string{"_TOKEN", "_SECRET", "_KEY", "_PASSWORD", "_CONNECTION_STRING"}

// IsSecretName reports whether an environment variable of this name holds a
// secret whose value must be masked in logs.
func IsSecretName(name string) bool {
	if aqSecretEnv[name] {
		return true
	}
	up := strings.ToUpper(name)
	for _, s := range secretSuffixes {
		if strings.HasSuffix(up, s) {
			return true
		}
	}
	return false
}

// IsAQSecret reports whether name is one of the factory's own credentials,
// which never reach an engine's environment: those of aqSecretEnv, and any
// AQ_* variable with a secret's name.
func IsAQSecret(name string) bool {
	return aqSecretEnv[name] || strings.HasPrefix(name, "AQ_") && IsSecretName(name)
}

// agentMarkers are variables an engine inherits from a parent agent session
// that change its behaviour (e.g. Claude Code refusing to nest). They are
// removed from every engine environment.
var agentMarkers = []string{"CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CODEX_SANDBOX", "CODEX_SANDBOX_NETWORK_DISABLED"}

// EngineEnv returns env (KEY=VALUE entries) without aq's secrets, without
// inherited agent markers and without any variable named in drop. Engine
// credentials such as ANTHROPIC_API_KEY stay: the engine needs them; they are
// still masked in logs by the Redactor.
func EngineEnv(env []string, drop ...string) []string {
	dropSet := make(map[string]bool, len(drop)+len(agentMarkers))
	for _, d := range drop {
		dropSet[d] = true
	}
	for _, m := range agentMarkers {
		dropSet[m] = true
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || IsAQSecret(name) || dropSet[name] {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Redactor masks secret values in text. It is safe for concurrent use.
// The zero value masks nothing; use NewRedactor or Add.
type Redactor struct {
	mu     sync.RWMutex
	values [][]byte // longest first, so a secret containing another is masked whole
	orig   []string // the values as added (without their encodings)
}

// minSecretLen keeps trivially short values ("1", "true") from being treated
// as secrets and masking half a log.
const minSecretLen = 4

// NewRedactor returns a Redactor that masks the given values and the values of
// every secret-named variable in env.
func NewRedactor(env []string, values ...string) *Redactor {
	r := &Redactor{}
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if ok && IsSecretName(name) {
			r.Add(val)
		}
	}
	r.Add(values...)
	return r
}

// FromEnviron is NewRedactor(os.Environ(), values...).
func FromEnviron(values ...string) *Redactor { return NewRedactor(os.Environ(), values...) }

// Add registers more secret values, each with its common encodings (see
// Encodings): a job that prints a token base64- or URL-encoded must not get
// it past the mask into a log or an uploaded artifact.
func (r *Redactor) Add(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	have := make(map[string]bool, len(r.values))
	for _, v := range r.values {
		have[string(v)] = true
	}
	for _, v := range values {
		v = strings.TrimSpace(v)
		if len(v) < minSecretLen {
			continue
		}
		if !slices.Contains(r.orig, v) {
			r.orig = append(r.orig, v)
		}
		for _, e := range append([]string{v}, Encodings(v)...) {
			if !have[e] {
				have[e] = true
				r.values = append(r.values, []byte(e))
			}
		}
	}
	sort.Slice(r.values, func(i, j int) bool { return len(r.values[i]) > len(r.values[j]) })
}

// minEncoded is the shortest encoded form masked: shorter runs of base64
// would mask ordinary text.
const minEncoded = 8

// Encodings are the forms of secret v that are masked besides v itself:
// its URL-encodings (query and path escaping) when they differ from v, and
// its base64 in the standard and the URL alphabet at each of the three
// alignments it can have inside a longer base64 stream (the characters that
// depend on v alone: so `printf %s "$TOKEN" | base64` is masked, and so is
// the token inside base64 of a larger text). A wrapped base64 (76
// characters a line) is masked line by line only where a line holds a
// whole aligned run.
func Encodings(v string) []string {
	var out []string
	add := func(e string) {
		if len(e) >= minEncoded && e != v && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	add(url.QueryEscape(v))
	add(url.PathEscape(v))
	n := len(v)
	for off := 0; off < 3; off++ {
		buf := make([]byte, off+n)
		copy(buf[off:], v)
		enc := base64.StdEncoding.EncodeToString(buf)
		start := (8*off + 5) / 6   // the first character made of v's bits only
		end := (8 * (off + n)) / 6 // past the last one
		if end-start < minEncoded {
			continue
		}
		core := enc[start:end]
		add(core)
		add(strings.NewReplacer("+", "-", "/", "_").Replace(core))
	}
	return out
}

// Bytes returns b with every secret replaced by Mask. b is not modified.
func (r *Redactor) Bytes(b []byte) []byte {
	if r == nil {
		return b
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, v := range r.values {
		if bytes.Contains(b, v) {
			b = bytes.ReplaceAll(b, v, []byte(Mask))
		}
	}
	return b
}

// Values are the secrets r masks, as they were added (without the
// encodings it masks besides): what the change scan looks for
// (internal/shipcheck), which makes the encodings itself.
func (r *Redactor) Values() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.orig)
}

// String returns s with every secret replaced by Mask.
func (r *Redactor) String(s string) string { return string(r.Bytes([]byte(s))) }

// MaxLen is the length of the longest registered secret; a streaming writer
// keeps that many bytes back so that a secret split across writes is masked.
func (r *Redactor) MaxLen() int {
	if r == nil {
		return 0
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if len(r.values) == 0 {
		return 0
	}
	return len(r.values[0])
}
