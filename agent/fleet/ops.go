package fleet

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/aqfleet/aq/job"
)

// Operator calls: what `aq job show|requeue|reject|ship|logs` and the board
// read from and do through the coordinator (docs/contract.md, "Submitting
// jobs and operator actions").
// Reads that an older coordinator may lack (factories, events, artifacts)
// answer *RouteAbsentError on 404/405, so the caller can show what it has
// and name what is missing.

// JobDoc is the coordinator's job document as an operator reads it: the
// contract's fields (docs/contract.md) and what coordinators add, all optional.
type JobDoc struct {
	ID             string        `json:"id"`
	ProductID      string        `json:"productId,omitempty"`
	Repo           string        `json:"repo"`
	RepoURL        string        `json:"repoUrl,omitempty"`
	Stage          string        `json:"stage"`
	Capabilities   []string      `json:"capabilities,omitempty"`
	Engine         string        `json:"engine,omitempty"`
	Priority       int           `json:"priority"`
	LeaseEpoch     int64         `json:"leaseEpoch"`
	Checkpoint     string        `json:"checkpoint,omitempty"`
	Attempts       int           `json:"attempts,omitempty"`
	Reason         string        `json:"reason,omitempty"`
	Detail         string        `json:"detail,omitempty"`
	Insights       *job.Insights `json:"insights,omitempty"`
	Previous       *job.Previous `json:"previous,omitempty"`
	Branch         string        `json:"branch,omitempty"`
	PRURL          string        `json:"prUrl,omitempty"`
	Holder         string        `json:"holderFactoryId,omitempty"`
	LeaseExpiresAt time.Time     `json:"leaseExpiresAt,omitzero"`
	NotBefore      time.Time     `json:"notBefore,omitzero"`
	Deps           []string      `json:"deps,omitempty"`
	CreatedAt      time.Time     `json:"createdAt,omitzero"`
	UpdatedAt      time.Time     `json:"updatedAt,omitzero"`
}

// JobEvent is one entry of a job's audit trail (GET /fleet/jobs/:id/events).
type JobEvent struct {
	Seq     int64     `json:"seq"`
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	Factory string    `json:"factory,omitempty"`
	Epoch   int64     `json:"epoch"`
	Stage   string    `json:"stage,omitempty"`
	Status  int       `json:"status,omitempty"`
	Call    string    `json:"call,omitempty"`
	Detail  string    `json:"detail,omitempty"`
}

// FactoryDoc is a factory as the coordinator knows it (GET /fleet/factories).
type FactoryDoc struct {
	ID              string       `json:"id"`
	Hostname        string       `json:"hostname,omitempty"`
	Capabilities    []string     `json:"capabilities,omitempty"`
	Repos           []string     `json:"repos,omitempty"`
	Engines         []string     `json:"engines,omitempty"`
	SeatLimit       int          `json:"seatLimit"`
	Load            float64      `json:"load"`
	Health          string       `json:"health,omitempty"`
	Running         []RunningJob `json:"running,omitempty"`
	Version         string       `json:"version,omitempty"`
	LastHeartbeatAt time.Time    `json:"lastHeartbeatAt,omitzero"`
	Stale           bool         `json:"stale"`
	Pool            string       `json:"pool,omitempty"`
}

// ArtifactDoc is an artifact's pointer (GET /fleet/jobs/:id/artifacts);
// its bytes are at URL (GET /fleet/artifacts/:id). docs/contract.md, "Artifacts".
type ArtifactDoc struct {
	ID           string    `json:"id"`
	JobID        string    `json:"jobId"`
	Name         string    `json:"name"`
	Kind         string    `json:"kind"`
	ContentType  string    `json:"contentType"`
	Encoding     string    `json:"encoding"`
	Size         int64     `json:"size"`
	OriginalSize int64     `json:"originalSize,omitempty"`
	StoredSize   int64     `json:"storedSize,omitempty"`
	Truncated    bool      `json:"truncated"`
	SHA256       string    `json:"sha256,omitempty"`
	Attempt      int       `json:"attempt,omitempty"`
	LeaseEpoch   int64     `json:"leaseEpoch"`
	FactoryID    string    `json:"factoryId,omitempty"`
	CreatedAt    time.Time `json:"createdAt,omitzero"`
	URL          string    `json:"url,omitempty"`
}

// Job reads one job (GET /fleet/jobs/:id); ErrGone when there is none.
func (c *Client) Job(ctx context.Context, id string) (*JobDoc, error) {
	var j JobDoc
	_, err := c.do(ctx, call{name: "GET /fleet/jobs/:id", method: http.MethodGet, path: "/fleet/jobs/" + url.PathEscape(id), budget: c.o.Budgets.QueueState, jobID: id}, &j)
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// Jobs lists every job (GET /fleet/jobs).
func (c *Client) Jobs(ctx context.Context) ([]JobDoc, error) {
	var a struct {
		Jobs []JobDoc `json:"jobs"`
	}
	_, err := c.do(ctx, call{name: RouteJobs, method: http.MethodGet, path: "/fleet/jobs", budget: c.o.Budgets.QueueState, operator: true, limit: 64 << 20}, &a)
	return a.Jobs, err
}

// Factories lists the factories (GET /fleet/factories; a route the
// coordinator may lack).
func (c *Client) Factories(ctx context.Context) ([]FactoryDoc, error) {
	var a struct {
		Factories []FactoryDoc `json:"factories"`
	}
	_, err := c.do(ctx, call{name: RouteFactories, method: http.MethodGet, path: "/fleet/factories", budget: c.o.Budgets.QueueState, operator: true}, &a)
	return a.Factories, err
}

// JobEvents reads a job's audit trail (GET /fleet/jobs/:id/events). A 404
// is a *RouteAbsentError: call it for a job known to exist.
func (c *Client) JobEvents(ctx context.Context, id string) ([]JobEvent, error) {
	var a struct {
		Events []JobEvent `json:"events"`
	}
	_, err := c.do(ctx, call{name: RouteEvents, method: http.MethodGet, path: "/fleet/jobs/" + url.PathEscape(id) + "/events", budget: c.o.Budgets.QueueState, operator: true}, &a)
	return a.Events, err
}

// JobAction applies an operator action (requeue, ship, reject) through POST
// /fleet/jobs/:id/actions/:action, with detail as the reason recorded
// (reject). A refusal is a *FencedError whose Detail is the coordinator's
// reason (409); no such job is ErrGone; a coordinator without the route is
// a *RouteAbsentError (told apart from a missing job by reading the job).
func (c *Client) JobAction(ctx context.Context, id, action, detail string) (*JobDoc, error) {
	var body any
	if detail != "" {
		body = map[string]string{"detail": detail}
	}
	var j JobDoc
	_, err := c.do(ctx, call{name: RouteAction, method: http.MethodPost, path: "/fleet/jobs/" + url.PathEscape(id) + "/actions/" + url.PathEscape(action),
		body: body, budget: c.o.Budgets.Submit, jobID: id, operator: true}, &j)
	if errors.Is(err, ErrGone) {
		if _, gerr := c.Job(ctx, id); gerr == nil {
			c.markAbsent(RouteAction, "the job exists; the action did not", true)
			return nil, &RouteAbsentError{Call: RouteAction, Status: http.StatusNotFound}
		}
	}
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// ReplaceJob gives job j.ID a new manifest (PUT /fleet/jobs/:id, the body
// of a submit): the coordinator puts it back to queued, keeping its
// history, unless it runs or its work is done (a *FencedError with the
// coordinator's reason). ErrGone: the coordinator has no such job (the
// caller may submit it). A coordinator without the route: a
// *RouteAbsentError.
func (c *Client) ReplaceJob(ctx context.Context, j *job.Job, bodyMd []byte) (*ReplaceAnswer, error) {
	req := SubmitRequest{Manifest: j, BodyMd: string(bodyMd), IdempotencyKey: j.IdempotencyKey}
	var a ReplaceAnswer
	_, err := c.do(ctx, call{name: RouteReplace, method: http.MethodPut, path: "/fleet/jobs/" + url.PathEscape(j.ID), body: req,
		budget: c.o.Budgets.Submit, jobID: j.ID, operator: true}, &a)
	if err = c.goneOrAbsent(ctx, RouteReplace, j.ID, err); err != nil {
		return nil, err
	}
	if a.JobID == "" {
		a.JobID = j.ID
	}
	return &a, nil
}

// RemoveJob removes job id (DELETE /fleet/jobs/:id) unless it runs (a
// *FencedError with the coordinator's reason). ErrGone: no such job. A
// coordinator without the route: a *RouteAbsentError.
func (c *Client) RemoveJob(ctx context.Context, id string) (*RemoveAnswer, error) {
	var a RemoveAnswer
	_, err := c.do(ctx, call{name: RouteRemove, method: http.MethodDelete, path: "/fleet/jobs/" + url.PathEscape(id),
		budget: c.o.Budgets.Submit, jobID: id, operator: true}, &a)
	if err = c.goneOrAbsent(ctx, RouteRemove, id, err); err != nil {
		return nil, err
	}
	if a.JobID == "" {
		a.JobID = id
	}
	return &a, nil
}

// goneOrAbsent checks an operator call's "no such job": a coordinator that
// has the job cannot mean it, so its route is absent (JobAction does the same).
func (c *Client) goneOrAbsent(ctx context.Context, route, id string, err error) error {
	if !errors.Is(err, ErrGone) {
		return err
	}
	if _, gerr := c.Job(ctx, id); gerr == nil {
		c.markAbsent(route, "the job exists; the call said it does not", true)
		return &RouteAbsentError{Call: route, Status: http.StatusNotFound}
	}
	return err
}

// JobArtifacts lists a job's artifacts (GET /fleet/jobs/:id/artifacts). A
// 404 is a *RouteAbsentError: call it for a job known to exist.
func (c *Client) JobArtifacts(ctx context.Context, id string) ([]ArtifactDoc, error) {
	var a struct {
		Artifacts []ArtifactDoc `json:"artifacts"`
	}
	_, err := c.do(ctx, call{name: RouteArtifactList, method: http.MethodGet, path: "/fleet/jobs/" + url.PathEscape(id) + "/artifacts", budget: c.o.Budgets.QueueState, operator: true}, &a)
	return a.Artifacts, err
}

// maxArtifactDownload bounds an artifact's bytes as served.
const maxArtifactDownload = 64 << 20

// ArtifactContent reads an artifact's content (GET /fleet/artifacts/:id, or
// the pointer's URL), gunzipped.
func (c *Client) ArtifactContent(ctx context.Context, a ArtifactDoc) ([]byte, error) {
	path := "/fleet/artifacts/" + url.PathEscape(a.ID)
	if a.URL != "" && a.URL[0] == '/' {
		path = a.URL
	}
	var b []byte
	_, err := c.do(ctx, call{name: RouteArtifactGet, method: http.MethodGet, path: path, budget: c.o.Budgets.QueueState, operator: true, raw: &b, limit: maxArtifactDownload}, nil)
	if err != nil {
		return nil, err
	}
	if a.Encoding == "gzip" && len(b) > 1 && b[0] == 0x1f && b[1] == 0x8b {
		// A server that serves the stored bytes without Content-Encoding.
		return gunzip(b, maxArtifactDownload)
	}
	return b, nil
}

// rawBody is an answer's body, gunzipped when the server sent it with
// Content-Encoding gzip.
func rawBody(resp *http.Response, data []byte, limit int64) ([]byte, error) {
	if resp.Header.Get("Content-Encoding") != "gzip" {
		return data, nil
	}
	return gunzip(data, limit)
}

func gunzip(b []byte, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("the artifact's bytes are not gzip: %w", err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit))
	if err != nil {
		return nil, fmt.Errorf("the artifact's bytes are not gzip: %w", err)
	}
	return out, nil
}

// ArtifactUpload is the body of POST /fleet/jobs/:id/artifacts: the
// pointer's fields and the content, gzipped and base64-encoded (Data).
// docs/contract.md, "Artifacts".
type ArtifactUpload struct {
	Name         string `json:"name"`
	Kind         string `json:"kind"` // log | transcript
	ContentType  string `json:"contentType"`
	Encoding     string `json:"encoding"` // gzip
	Size         int64  `json:"size"`     // the content (masked, truncated) before gzip
	OriginalSize int64  `json:"originalSize"`
	Truncated    bool   `json:"truncated"`
	SHA256       string `json:"sha256"` // of the content before gzip
	Attempt      int    `json:"attempt,omitempty"`
	LeaseEpoch   int64  `json:"leaseEpoch"`
	FactoryID    string `json:"factoryId,omitempty"`
	Data         string `json:"data"` // base64 (standard) of the gzip bytes
}

// UploadArtifact posts one artifact. A coordinator without the route
// answers a *RouteAbsentError, then and for the rest of the client's life
// (nothing is sent again), with one warning: uploads are skipped, not
// retried forever (routes.go).
func (c *Client) UploadArtifact(ctx context.Context, jobID string, up ArtifactUpload, budget time.Duration) (*ArtifactDoc, error) {
	if up.FactoryID == "" {
		up.FactoryID = c.FactoryID()
	}
	var a ArtifactDoc
	_, err := c.do(ctx, call{name: RouteArtifacts, method: http.MethodPost, path: "/fleet/jobs/" + url.PathEscape(jobID) + "/artifacts",
		body: up, budget: budget, jobID: jobID}, &a)
	if err != nil {
		return nil, err
	}
	return &a, nil
}
