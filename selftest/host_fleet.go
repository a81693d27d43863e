package selftest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/version"
)

// fleetProbe is one authenticated GET /fleet/queue-state: the harmless call
// that tells whether the coordinator is reachable, whether it takes this
// factory's token, and what its clock says.
type fleetProbe struct {
	api     string
	source  string // where the token came from
	status  int
	date    time.Time
	sentAt  time.Time
	elapsed time.Duration
	version int64
	err     error // no answer at all
}

// fleetOn reports whether fleet mode is configured, and why not.
func (h *hostEnv) fleetOn() (bool, string) {
	if h.cfg == nil {
		return false, "the configuration did not load (see host.config.valid)"
	}
	if !h.cfg.Fleet {
		return false, "fleet mode is off (AQ_FLEET=0): no coordinator to check"
	}
	return true, ""
}

// token is the bearer token a factory would use now: the stored
// credentials' for this coordinator, else AQ_FLEET_TOKEN.
func (h *hostEnv) fleetToken() (string, string) {
	c := h.cfg
	if creds, err := fleet.LoadCredentials(c.CredentialsFile()); err == nil && strings.TrimRight(creds.API, "/") == strings.TrimRight(c.FleetAPI, "/") {
		return creds.Token, "the credentials file"
	}
	if c.FleetToken != "" {
		return c.FleetToken, "AQ_FLEET_TOKEN"
	}
	return "", ""
}

func (h *hostEnv) probeFleet(ctx context.Context) *fleetProbe {
	h.fleetOnce.Do(func() {
		c := h.cfg
		p := &fleetProbe{api: c.FleetAPI}
		h.fleet = p
		tok, src := h.fleetToken()
		p.source = src
		if c.FleetAPI == "" {
			p.err = errors.New("AQ_FLEET_API is not set")
			return
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(pctx, http.MethodGet, strings.TrimRight(c.FleetAPI, "/")+"/fleet/queue-state", nil)
		if err != nil {
			p.err = err
			return
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		if c.ProductID != "" {
			req.Header.Set("x-product-id", c.ProductID)
		}
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", "aq/"+version.Get().Version+" (selftest)")
		p.sentAt = time.Now()
		resp, err := http.DefaultClient.Do(req)
		p.elapsed = time.Since(p.sentAt)
		if err != nil {
			p.err = errors.New(scrubURLErr(err))
			return
		}
		defer resp.Body.Close()
		p.status = resp.StatusCode
		if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			p.date = d
		}
		var qs struct {
			Version int64 `json:"version"`
		}
		if b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20)); err == nil {
			_ = json.Unmarshal(b, &qs)
		}
		p.version = qs.Version
	})
	return h.fleet
}

// scrubURLErr is a net/http error without the URL's query.
func scrubURLErr(err error) string {
	var ue interface{ Unwrap() error }
	msg := err.Error()
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			var ne net.Error
			if errors.As(inner, &ne) && ne.Timeout() {
				return "no answer within 10s"
			}
			return inner.Error()
		}
	}
	return msg
}

func checkFleetSettings(ctx context.Context, s *session) (string, error) {
	if on, why := s.h.fleetOn(); !on {
		return "", skipf("%s", why)
	}
	c := s.h.cfg
	if c.FleetAPI == "" {
		return "", failf("AQ_FLEET=1 but AQ_FLEET_API is not set: set it to the coordinator's base URL (https://host/api)")
	}
	tok, src := s.h.fleetToken()
	if tok == "" {
		return "", failf("no fleet token: this factory has no credentials file for %s and AQ_FLEET_TOKEN is empty (set it to an enrollment token)", c.FleetAPI)
	}
	r := fmt.Sprintf("coordinator %s, factory %s, token from %s", c.FleetAPI, c.FactoryID, src)
	if !c.FleetRoute {
		r += "; AQ_FLEET_ROUTE=0: aq run uses the local queue"
	}
	return r, nil
}

func checkFleetReachable(ctx context.Context, s *session) (string, error) {
	if on, why := s.h.fleetOn(); !on {
		return "", skipf("%s", why)
	}
	p := s.h.probeFleet(ctx)
	if p.err != nil {
		return "", failf("cannot reach the coordinator at %s: %v (check AQ_FLEET_API and the network)", p.api, p.err)
	}
	return fmt.Sprintf("%s answered GET /fleet/queue-state with %d in %s", p.api, p.status, ms(p.elapsed)), nil
}

func checkFleetToken(ctx context.Context, s *session) (string, error) {
	if on, why := s.h.fleetOn(); !on {
		return "", skipf("%s", why)
	}
	p := s.h.probeFleet(ctx)
	switch {
	case p.err != nil:
		return "", failf("the coordinator did not answer (see host.fleet.reachable): %v", p.err)
	case p.source == "":
		return "", failf("no token to check (see host.fleet.settings)")
	case p.status == http.StatusUnauthorized || p.status == http.StatusForbidden:
		return "", failf("the coordinator refused the token from %s (%d %s): check AQ_FLEET_TOKEN; if this factory's token was revoked, remove $AQ_HOME/credentials and enroll again", p.source, p.status, http.StatusText(p.status))
	case p.status < 200 || p.status > 299:
		return "", failf("GET /fleet/queue-state answered %d %s", p.status, http.StatusText(p.status))
	}
	return fmt.Sprintf("the coordinator accepts the token from %s (queue-state version %d)", p.source, p.version), nil
}

// clockTolerance is how far this host's clock may be from the
// coordinator's: leases last 90 s and are renewed every 30 s.
const clockTolerance = 30 * time.Second

func checkClockCoordinator(ctx context.Context, s *session) (string, error) {
	if on, why := s.h.fleetOn(); !on {
		return "", skipf("%s", why)
	}
	p := s.h.probeFleet(ctx)
	if p.err != nil {
		return "", skipf("the coordinator did not answer (see host.fleet.reachable)")
	}
	if p.date.IsZero() {
		return "", skipf("the coordinator's answer carries no Date header")
	}
	// The header has a resolution of a second and was made between send
	// and receipt: compare with the middle of the round trip.
	mid := p.sentAt.Add(p.elapsed / 2)
	skew := mid.Sub(p.date)
	abs := skew
	if abs < 0 {
		abs = -abs
	}
	if abs > clockTolerance+time.Second {
		return "", failf("this host's clock is %s off the coordinator's: leases (90s, renewed every 30s) need it within %s; fix NTP", abs.Round(time.Second), clockTolerance)
	}
	return fmt.Sprintf("within %s of the coordinator's clock (tolerance %s)", abs.Round(time.Second), clockTolerance), nil
}

// --- credentials -------------------------------------------------------------

func (h *hostEnv) credentialsFile() string {
	if h.cfg != nil {
		return h.cfg.CredentialsFile()
	}
	if home := h.home(); home != "" {
		return home + "/credentials"
	}
	return ""
}

func checkCredentialsMode(ctx context.Context, s *session) (string, error) {
	path := s.h.credentialsFile()
	fi, err := os.Stat(path)
	if path == "" || errors.Is(err, fs.ErrNotExist) {
		return "", skipf("no credentials file (this factory has not enrolled)")
	}
	if err != nil {
		return "", failf("cannot stat %s: %v", path, unwrapPath(err))
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return "", failf("%s is mode %04o: the factory token is readable by others; run chmod 600 %s (and rotate the token if others may have read it)", path, m, path)
	}
	return fmt.Sprintf("%s is mode %04o", path, fi.Mode().Perm()), nil
}

func checkCredentialsValid(ctx context.Context, s *session) (string, error) {
	path := s.h.credentialsFile()
	if path == "" || !fixture.Exists(path) {
		return "", skipf("no credentials file (this factory has not enrolled)")
	}
	c, err := fleet.LoadCredentials(path)
	var ce *fleet.CredentialsError
	if errors.As(err, &ce) {
		return "", failf("%s (%s)", ce.Error(), ce.Fix)
	}
	if err != nil {
		return "", err
	}
	r := fmt.Sprintf("enrolled as %s with %s", c.FactoryID, c.API)
	if !c.EnrolledAt.IsZero() {
		r += " on " + c.EnrolledAt.UTC().Format("2006-01-02")
	}
	if s.h.cfg != nil && s.h.cfg.FleetAPI != "" && strings.TrimRight(c.API, "/") != strings.TrimRight(s.h.cfg.FleetAPI, "/") {
		r += "; note: AQ_FLEET_API is " + s.h.cfg.FleetAPI + ", so the next fleet start enrolls again"
	}
	return r, nil
}

// --- Service Bus -------------------------------------------------------------

func (h *hostEnv) sbConfig() (dispatch.Config, bool) {
	c := h.cfg
	if c == nil {
		return dispatch.Config{}, false
	}
	dc := dispatch.Config{FactoryID: c.FactoryID, Namespace: c.SBNamespace, ConnectionString: c.SBConnectionString,
		Topic: c.SBTopic, Subscription: c.SBSubscription, Sessions: c.SBSessions}
	return dc, dc.Enabled()
}

func checkSBSettings(ctx context.Context, s *session) (string, error) {
	if s.h.cfg == nil {
		return "", skipf("the configuration did not load (see host.config.valid)")
	}
	dc, on := s.h.sbConfig()
	if !on {
		return "", skipf("Service Bus is not configured (AQ_SB_NAMESPACE and AQ_SB_CONNECTION_STRING unset): jobs come by the poll path")
	}
	// New checks the settings the way the daemon will, without dialling.
	_, err := dispatch.New(dispatch.Options{
		Config:   dc,
		Acceptor: dispatch.AcceptFunc(func(context.Context, string) (dispatch.Accepted, error) { return dispatch.Accepted{}, nil }),
		Handler:  func(context.Context, dispatch.Accepted) {},
		Slots:    dispatch.NewSemaphore(1),
	})
	if err != nil {
		return "", err
	}
	how := "namespace " + dc.Namespace + " with managed identity"
	if dc.ConnectionString != "" {
		how = "a connection string (development/emulator)"
	}
	sub := dc.Subscription
	if sub == "" {
		sub = dc.FactoryID
	}
	if dc.Sessions {
		sub += " (sessions keyed by repo: it must require sessions)"
	}
	return fmt.Sprintf("%s, topic %s, subscription %s", how, dc.Topic, sub), nil
}

func checkSBEmulator(ctx context.Context, s *session) (string, error) {
	if s.h.cfg == nil {
		return "", skipf("the configuration did not load (see host.config.valid)")
	}
	cs := s.h.cfg.SBConnectionString
	if cs == "" {
		return "", skipf("no Service Bus connection string")
	}
	host, emulator, loopback := dispatch.EmulatorEndpoint(cs)
	if !emulator {
		return "", skipf("the connection string is not an emulator's (no UseDevelopmentEmulator=true)")
	}
	if loopback {
		return "emulator endpoint " + host + " is loopback", nil
	}
	return "", failf("AQ_SB_CONNECTION_STRING has UseDevelopmentEmulator=true for %s, which is not loopback: the key would cross the network over plain AMQP (use a loopback emulator, or AQ_SB_NAMESPACE with managed identity)", host)
}

func checkSBFleet(ctx context.Context, s *session) (string, error) {
	if s.h.cfg == nil {
		return "", skipf("the configuration did not load (see host.config.valid)")
	}
	if _, on := s.h.sbConfig(); !on {
		return "", skipf("Service Bus is not configured")
	}
	if !s.h.cfg.Fleet {
		return "", failf("AQ_SB_NAMESPACE or AQ_SB_CONNECTION_STRING is set but fleet mode is off (AQ_FLEET=0): the broker is only read in fleet mode; set AQ_FLEET=1 or unset them")
	}
	return "broker delivery is configured with fleet mode on", nil
}
