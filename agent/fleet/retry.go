package fleet

import (
	"context"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Budgets are how long each call keeps retrying (network errors, 429, 5xx)
// before it gives up with a *TransientError. They match each call's
// importance (docs/fleet.md lists them):
//
//   - final reports (terminal PATCH, /fleet/fail) retry for minutes, then go
//     to the spool;
//   - a heartbeat retries for less than its interval (the next beat follows);
//   - a lease renewal retries until the lease's expiry is near (the lease
//     owner bounds each call with a context deadline; Renew is its ceiling);
//   - a release retries for seconds (the reaper frees the lease anyway);
//   - claim and queue-state are short (the next poll tick follows).
type Budgets struct {
	Enroll      time.Duration
	Heartbeat   time.Duration
	QueueState  time.Duration
	Claim       time.Duration
	Accept      time.Duration
	Renew       time.Duration
	Release     time.Duration
	Report      time.Duration // non-terminal PATCH (stage building)
	FinalReport time.Duration // terminal PATCH and /fleet/fail
	Drain       time.Duration // one spooled report, per drain attempt
	Submit      time.Duration
	// LiveLog bounds one live log chunk's retries: the next flush, a
	// second later, sends it again (livelog.go).
	LiveLog time.Duration

	// MinWait and MaxWait bound the exponential backoff between tries
	// (with jitter).
	MinWait time.Duration
	MaxWait time.Duration
	// PerTry bounds one HTTP attempt (connect to last byte).
	PerTry time.Duration
}

// DefaultBudgets are the production budgets for a heartbeat interval hb.
func DefaultBudgets(hb time.Duration) Budgets {
	if hb <= 0 {
		hb = 30 * time.Second
	}
	return Budgets{
		Enroll:      2 * time.Minute,
		Heartbeat:   hb / 2,
		QueueState:  10 * time.Second,
		Claim:       15 * time.Second,
		Accept:      15 * time.Second,
		Renew:       5 * time.Minute,
		Release:     5 * time.Second,
		Report:      30 * time.Second,
		FinalReport: 5 * time.Minute,
		Drain:       30 * time.Second,
		Submit:      time.Minute,
		LiveLog:     2 * time.Second,
		MinWait:     500 * time.Millisecond,
		MaxWait:     30 * time.Second,
		PerTry:      30 * time.Second,
	}
}

// maxRetryAfter caps a server's Retry-After: a coordinator asking for an hour
// gets the budget's end instead.
const maxRetryAfter = 5 * time.Minute

// Backoff is the wait before retry attempt n (0 for the first retry):
// exponential from lo, capped at hi, with "equal jitter" (half fixed, half
// random) so that a fleet of factories does not retry in step. A 429 or 503
// with a Retry-After header waits what the server asked (capped).
func Backoff(lo, hi time.Duration, n int, resp *http.Response, rnd func() float64) time.Duration {
	if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return min(d, maxRetryAfter)
		}
	}
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	hi = max(hi, lo)
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	half := d / 2
	return half + time.Duration(rnd()*float64(d-half))
}

// Jitter returns d spread uniformly over [d-f·d, d+f·d]: periodic calls
// (heartbeat, poll, renew) are jittered so a fleet does not beat in step.
func Jitter(d time.Duration, f float64, rnd func() float64) time.Duration {
	if d <= 0 || f <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 - f + 2*f*rnd()))
}

func retryAfter(h string, now time.Time) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(h); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(h); err == nil {
		if d := t.Sub(now); d > 0 {
			return d, true
		}
		return 0, true
	}
	return 0, false
}

// Retryable decides whether a try's result can succeed on retry: network
// errors (but not a bad URL or an untrusted certificate), 429 and 5xx (but
// not 501). Every other status, 4xx included, stops the retrier.
func Retryable(resp *http.Response, err error) bool {
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			var uae x509.UnknownAuthorityError
			var hne x509.HostnameError
			var cie x509.CertificateInvalidError
			if errors.As(ue.Err, &uae) || errors.As(ue.Err, &hne) || errors.As(ue.Err, &cie) {
				return false
			}
			msg := ue.Error()
			if strings.Contains(msg, "unsupported protocol scheme") || strings.Contains(msg, "stopped after") {
				return false
			}
		}
		return true
	}
	if resp == nil {
		return false
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return true
	case resp.StatusCode == http.StatusNotImplemented:
		return false
	case resp.StatusCode >= 500:
		return true
	}
	return false
}

// attempts is one call's retry state: it counts tries and decides, within
// the call's budget, whether to try again and how long to wait first.
type attempts struct {
	deadline time.Time // the budget's end (or the context's, if earlier)
	min, max time.Duration
	rnd      func() float64
	now      func() time.Time
	tries    int
	next     time.Duration
}

// checkRetry is the go-retryablehttp CheckRetry of one call.
func (a *attempts) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	a.tries++
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if !Retryable(resp, err) {
		return false, nil
	}
	a.next = Backoff(a.min, a.max, a.tries-1, resp, a.rnd)
	if a.now().Add(a.next).After(a.deadline) {
		return false, nil // the budget is spent: give the last answer back
	}
	return true, nil
}

// backoff is the go-retryablehttp Backoff of one call: the wait checkRetry
// chose.
func (a *attempts) backoff(_, _ time.Duration, _ int, _ *http.Response) time.Duration {
	return a.next
}

// defaultRand is the jitter source.
func defaultRand() float64 { return rand.Float64() }
