package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"
)

// Exchange is one request and its answer as they were, uninterpreted: for
// a conformance check (aq fleet check, agent/fleetcheck) that must see the
// status, a header or the body that the typed calls turn into errors.
type Exchange struct {
	Status int
	Header http.Header
	Body   []byte // at most 64 KiB
}

// JSON reports whether the answer's body is a JSON object or array.
func (e *Exchange) JSON() bool {
	b := bytes.TrimSpace(e.Body)
	return len(b) > 0 && (b[0] == '{' || b[0] == '[') && json.Valid(b)
}

// Exchange sends one request to path (under the API URL, e.g.
// "/fleet/aq-route-probe") with the client's headers, once: no retry, no
// classification, nothing learnt about routes. An error is a request that
// got no answer (its text redacted, the URL's query dropped).
func (c *Client) Exchange(ctx context.Context, method, path string, body []byte) (*Exchange, error) {
	e, err := c.exchange(ctx, method, path, body, 30*time.Second)
	if err != nil {
		return nil, errors.New(c.redact(scrubURL(err.Error())))
	}
	return e, nil
}

// exchange sends one request with the client's headers, without retries
// or classification, its try bounded by the client's PerTry up to most;
// the answer's body is read up to 64 KiB. Exchange and the route probes
// (raw) are its callers.
func (c *Client) exchange(ctx context.Context, method, path string, body []byte, most time.Duration) (*Exchange, error) {
	to := c.o.Budgets.PerTry
	if to <= 0 || to > most {
		to = most
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, rd)
	if err != nil {
		return nil, err
	}
	c.setHeaders(req.Header, body != nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return &Exchange{Status: resp.StatusCode, Header: resp.Header.Clone(), Body: data}, nil
}
