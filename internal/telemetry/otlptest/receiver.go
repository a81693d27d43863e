// Package otlptest is an OTLP/HTTP trace receiver on 127.0.0.1 for tests: a
// real HTTP server that decodes each POST /v1/traces body — a protobuf (or
// JSON) ExportTraceServiceRequest, gzip or not — with the OTLP protocol's own
// generated types, and records the spans, so a test can assert the trace a
// real run exported.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Span is one received span.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Service                   string // the resource's service.name
	Resource                  map[string]any
	Attrs                     map[string]any
	Events                    []Event
	Error                     bool // status code ERROR
	Start, End                time.Time
}

// Event is one span event.
type Event struct {
	Name  string
	Attrs map[string]any
}

// Receiver records the spans exported to it.
type Receiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	spans    []Span
	requests int
	bytes    int64
	headers  []http.Header
	answer   func(n int) int // status for request n (1-based); nil: 200
}

// Start serves a receiver until the test ends.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	r := &Receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	tb.Cleanup(r.srv.Close)
	return r
}

// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT (the
// exporter appends /v1/traces).
func (r *Receiver) URL() string { return r.srv.URL }

// Answer makes request n (1-based) answer status(n) instead of 200 (the body
// is then dropped, as a collector that refuses it would).
func (r *Receiver) Answer(status func(n int) int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answer = status
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "not an OTLP traces request", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if strings.EqualFold(req.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.requests++
	n := r.requests
	r.headers = append(r.headers, req.Header.Clone())
	answer := r.answer
	r.mu.Unlock()
	if answer != nil {
		if code := answer(n); code != http.StatusOK {
			http.Error(w, "refused by the test", code)
			return
		}
	}
	var msg coltracepb.ExportTraceServiceRequest
	if strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
		err = protojson.Unmarshal(raw, &msg)
	} else {
		err = proto.Unmarshal(raw, &msg)
	}
	if err != nil {
		http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	got := decode(&msg)
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.bytes += int64(len(raw))
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = io.Copy(w, bytes.NewReader(out))
}

func decode(msg *coltracepb.ExportTraceServiceRequest) []Span {
	var out []Span
	for _, rs := range msg.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		svc, _ := res["service.name"].(string)
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					Name: s.GetName(), Service: svc, Resource: res, Attrs: attrs(s.GetAttributes()),
					Error: s.GetStatus().GetCode() == 2,
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
				}
				if p := s.GetParentSpanId(); len(p) > 0 {
					sp.ParentID = hex.EncodeToString(p)
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{Name: e.GetName(), Attrs: attrs(e.GetAttributes())})
				}
				out = append(out, sp)
			}
		}
	}
	return out
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	}
	return nil
}

// Spans returns the spans received so far, in arrival order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Requests counts the export requests received (refused ones too), and
// Bytes the uncompressed bytes of those accepted.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Bytes: see Requests.
func (r *Receiver) Bytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}

// Headers are the HTTP headers of every request received.
func (r *Receiver) Headers() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.headers...)
}

// Trace returns the spans of one trace, ordered by start time.
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Root returns the root span named name whose attribute key is value, if
// one arrived.
func (r *Receiver) Root(name, key string, value any) (Span, bool) {
	for _, s := range r.Spans() {
		if s.ParentID == "" && s.Name == name && s.Attrs[key] == value {
			return s, true
		}
	}
	return Span{}, false
}

// Children are the spans of trace whose parent is id, in start order.
func Children(trace []Span, id string) []Span {
	var out []Span
	for _, s := range trace {
		if s.ParentID == id {
			out = append(out, s)
		}
	}
	return out
}

// Names are the spans' names, in order.
func Names(spans []Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// EventNames are a span's event names, in order.
func (s Span) EventNames() []string {
	out := make([]string, len(s.Events))
	for i, e := range s.Events {
		out[i] = e.Name
	}
	return out
}
