package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// The live log's wire format and calls (docs/fleet.md, "Live logs"): a
// factory appends chunks of a running job's engine output with POST
// /fleet/jobs/:id/log, fenced by the lease epoch and idempotent by sequence
// number and offset; anyone with a token reads them back from an offset
// with GET /fleet/jobs/:id/log, long-polled.

// Kinds of live log chunks and records.
const (
	// LogOutput is engine output: Size bytes of content (after masking).
	LogOutput = "output"
	// LogGap marks Size bytes of the stream that were not streamed (the
	// coordinator was away longer than the factory's backlog holds, or it
	// lost them): they are in the job's final artifact, not in the live log.
	LogGap = "gap"
)

// LogChunk is the body of POST /fleet/jobs/:id/log: one chunk of one run's
// stream. A run is one lease epoch of the job (one attempt); its stream
// counts bytes from 0 as streamed (after masking).
type LogChunk struct {
	Attempt    int    `json:"attempt"`
	LeaseEpoch int64  `json:"leaseEpoch"`
	FactoryID  string `json:"factoryId"`
	// Seq numbers the run's chunks from 1; a chunk re-sent after a lost
	// answer keeps its seq and offset, and the coordinator answers it 200
	// without storing it twice.
	Seq int64 `json:"seq"`
	// Offset is where the chunk starts in the run's stream: the coordinator
	// appends it only where its copy of the stream ends (else 416).
	Offset int64  `json:"offset"`
	Kind   string `json:"kind"` // LogOutput or LogGap
	// Size is the content's length before gzip (output), or the number of
	// bytes not streamed (gap).
	Size int64 `json:"size"`
	// Encoding is "gzip" for output; Data the gzip bytes, base64
	// (standard), as an artifact's.
	Encoding string `json:"encoding,omitempty"`
	Data     string `json:"data,omitempty"`
	// End says the run's stream ends after this chunk (which may be empty:
	// an output chunk of size 0).
	End bool `json:"end,omitempty"`
}

// LogAppended is the answer to a chunk taken (200): the run's stream at the
// coordinator now ends at Next. Duplicate: the chunk was held already.
type LogAppended struct {
	Next      int64 `json:"next"`
	Duplicate bool  `json:"duplicate,omitempty"`
}

// LogOffsetError is a 416 to a chunk: its offset does not follow what the
// coordinator holds of the run, which ends at Next. The writer resends from
// Next, or marks what it can no longer send as a gap.
type LogOffsetError struct {
	Next   int64
	Detail string
}

func (e *LogOffsetError) Error() string {
	msg := fmt.Sprintf("the coordinator's live log of this run ends at offset %d", e.Next)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// LogQuery is what GET /fleet/jobs/:id/log asks for.
type LogQuery struct {
	// Epoch picks the run (its lease epoch); 0: the latest run.
	Epoch int64
	// Offset is where to start in the run's stream.
	Offset int64
	// Wait makes the coordinator hold the answer until the run has bytes
	// past Offset, ends, or a newer run starts — or Wait passes (at most
	// MaxLogWait).
	Wait time.Duration
}

// MaxLogWait bounds a long poll of the live log (below the client's
// per-try timeout).
const MaxLogWait = 20 * time.Second

// LogPage is GET /fleet/jobs/:id/log's answer: the records of one run from
// Offset to Next.
type LogPage struct {
	JobID      string `json:"jobId"`
	Attempt    int    `json:"attempt"`
	LeaseEpoch int64  `json:"leaseEpoch"` // 0: the job has no run with a live log (yet)
	FactoryID  string `json:"factoryId,omitempty"`
	// Offset is where Records start; Next is the offset to ask for next.
	Offset  int64       `json:"offset"`
	Next    int64       `json:"next"`
	Records []LogRecord `json:"records"`
	// Ended: nothing more will be appended to this run (its writer sent
	// its end, or the run's lease ended).
	Ended bool `json:"ended"`
	// Runs are the job's runs with a live log, oldest first.
	Runs []LogRun `json:"runs"`
}

// LogRecord is one stretch of a run's stream: output (Text, Size bytes) or
// a gap (Size bytes not streamed).
type LogRecord struct {
	Offset int64  `json:"offset"`
	Kind   string `json:"kind"`
	Size   int64  `json:"size"`
	// Text is the output as UTF-8 (bytes that are not UTF-8 read as
	// U+FFFD; the artifact is the log of record).
	Text string `json:"text,omitempty"`
}

// LogRun is one run of a job that has a live log.
type LogRun struct {
	Attempt    int       `json:"attempt"`
	LeaseEpoch int64     `json:"leaseEpoch"`
	FactoryID  string    `json:"factoryId,omitempty"`
	Size       int64     `json:"size"` // the stream's length (its next offset)
	Ended      bool      `json:"ended"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
}

// AppendLog posts one chunk of a running job's live log. Errors:
// *FencedError (409: this factory no longer holds the run's lease; stop),
// *LogOffsetError (416: resume where the coordinator stands),
// *RouteAbsentError (the coordinator has no live logs; remembered),
// ErrGone (no such job), *StatusError (refused, or a JSON answer without
// next), *ContractError (an answer that is not the contract's JSON),
// *AuthError, *TransientError.
func (c *Client) AppendLog(ctx context.Context, jobID string, ch LogChunk) (LogAppended, error) {
	if ch.FactoryID == "" {
		ch.FactoryID = c.FactoryID()
	}
	budget := c.o.Budgets.LiveLog
	if budget <= 0 {
		budget = DefaultBudgets(0).LiveLog
	}
	var a struct {
		Next      *int64 `json:"next"`
		Duplicate bool   `json:"duplicate"`
	}
	_, err := c.do(ctx, call{name: RouteLogAppend, method: http.MethodPost, path: "/fleet/jobs/" + url.PathEscape(jobID) + "/log",
		body: ch, budget: budget, jobID: jobID, epoch: ch.LeaseEpoch}, &a)
	if err != nil {
		return LogAppended{}, err
	}
	if a.Next == nil {
		return LogAppended{}, &StatusError{Call: RouteLogAppend, Status: http.StatusOK, Detail: "the answer is not the expected JSON: it carries no next offset"}
	}
	return LogAppended{Next: *a.Next, Duplicate: a.Duplicate}, nil
}

// ReadLog reads a run of a job's live log from q.Offset, long-polled for
// q.Wait. A coordinator without the route answers a *RouteAbsentError (no
// log line: the caller says what it does instead); no such job ErrGone; an
// answer that is not JSON a *ContractError, JSON that is not a log page a
// *StatusError.
func (c *Client) ReadLog(ctx context.Context, jobID string, q LogQuery) (*LogPage, error) {
	v := url.Values{}
	if q.Epoch > 0 {
		v.Set("epoch", strconv.FormatInt(q.Epoch, 10))
	}
	v.Set("offset", strconv.FormatInt(q.Offset, 10))
	if w := min(q.Wait, MaxLogWait); w > 0 {
		v.Set("wait", strconv.FormatFloat(w.Seconds(), 'f', -1, 64))
	}
	var p LogPage
	_, err := c.do(ctx, call{name: RouteLogRead, method: http.MethodGet, path: "/fleet/jobs/" + url.PathEscape(jobID) + "/log?" + v.Encode(),
		budget: c.o.Budgets.QueueState, jobID: jobID, operator: true}, &p)
	if err != nil {
		return nil, err
	}
	if err := p.check(q); err != nil {
		return nil, &StatusError{Call: RouteLogRead, Status: http.StatusOK, Detail: "the answer is not the contract's: " + err.Error()}
	}
	return &p, nil
}

// check refuses a page that cannot be the contract's answer to q.
func (p *LogPage) check(q LogQuery) error {
	if p.LeaseEpoch < 0 || p.Offset < 0 || p.Next < p.Offset {
		return fmt.Errorf("offsets %d..%d", p.Offset, p.Next)
	}
	if q.Epoch > 0 && p.LeaseEpoch != 0 && p.LeaseEpoch != q.Epoch {
		return fmt.Errorf("run %d asked, run %d answered", q.Epoch, p.LeaseEpoch)
	}
	at := p.Offset
	for _, r := range p.Records {
		switch {
		case r.Kind != LogOutput && r.Kind != LogGap:
			return fmt.Errorf("a record of kind %q", r.Kind)
		case r.Size < 0 || r.Offset != at:
			return fmt.Errorf("a record at %d (size %d) where %d was due", r.Offset, r.Size, at)
		}
		at += r.Size
	}
	if at != p.Next {
		return fmt.Errorf("records end at %d, next is %d", at, p.Next)
	}
	return nil
}

// IsLogOffset reports a 416 to a chunk, and where the coordinator stands.
func IsLogOffset(err error) (*LogOffsetError, bool) {
	var le *LogOffsetError
	ok := errors.As(err, &le)
	return le, ok
}
