package fakellm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxBody is the largest request body the fake reads (a CLI's request with
// its whole system prompt and tool schemas is about 100 KB); a larger one is
// answered 413 and recorded cut.
const MaxBody = 16 << 20

// A Server is a fake model API on one listener. Its handlers are the API
// files' (routes); every request is recorded, whatever its path.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT (no path, no
	// trailing slash): what a CLI's base URL variable is set to.
	URL string

	ln     net.Listener
	srv    *http.Server
	player *player

	pending atomic.Int64 // requests being answered

	mu   sync.Mutex
	reqs []Request
	ids  map[string]int // the last id handed out per prefix
	done chan struct{}
}

// A Request is one request the server received.
type Request struct {
	// Seq numbers the requests from 1, in the order they arrived.
	Seq    int
	At     time.Time
	Method string
	// Path is the URL's path; Query its raw query ("beta=true").
	Path, Query string
	Header      http.Header
	Body        []byte
	// Turn is the script turn the request was answered from (-1: After or
	// a side answer, -2: not a model request), and Answer says how:
	// "turn", "after", "side", "fault 429", "cut", "html", "404", ….
	Turn   int
	Answer string
}

// Contains reports whether s appears anywhere in the request: its path and
// query, a header's name or value, or its body.
func (r Request) Contains(s string) bool {
	if s == "" {
		return false
	}
	if strings.Contains(r.Path, s) || strings.Contains(r.Query, s) || bytes.Contains(r.Body, []byte(s)) {
		return true
	}
	for k, vs := range r.Header {
		if strings.Contains(k, s) {
			return true
		}
		for _, v := range vs {
			if strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

// route is one API's handler for a method and path ("POST /v1/messages").
// The API files add theirs in init (routes).
type route struct {
	pattern string
	handle  func(s *Server, w http.ResponseWriter, r *http.Request, rec *Request)
}

var routes []route

// Start serves script on a new listener on 127.0.0.1 (an OS-chosen port).
func Start(script Script) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakellm: %w", err)
	}
	return Serve(ln, script), nil
}

// Serve serves script on ln, which the caller opened (in a network
// namespace of its own, say) and the server now owns.
func Serve(ln net.Listener, script Script) *Server {
	s := &Server{
		URL: "http://" + ln.Addr().String(),
		ln:  ln, player: &player{script: script},
		ids: map[string]int{}, done: make(chan struct{}),
	}
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.HandleFunc(rt.pattern, s.wrap(rt.handle))
	}
	mux.HandleFunc("/", s.wrap(func(s *Server, w http.ResponseWriter, r *http.Request, rec *Request) {
		rec.Answer = "404"
		writeError(w, http.StatusNotFound, "not_found_error", "fakellm: no such endpoint: "+r.Method+" "+r.URL.Path, nil)
	}))
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Minute}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s
}

// Close stops the server and every connection it holds.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Addr is the listener's address (127.0.0.1:PORT).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Requests is a copy of every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Pending is how many requests the server is answering now (a slow first
// byte holds one).
func (s *Server) Pending() int { return int(s.pending.Load()) }

// Played is how many of the script's turns were answered.
func (s *Server) Played() int { return s.player.played() }

// wrap records the request, then hands it to h.
func (s *Server) wrap(h func(*Server, http.ResponseWriter, *http.Request, *Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.pending.Add(1)
		defer s.pending.Add(-1)
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
		rec := &Request{
			At: time.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
			Header: r.Header.Clone(), Body: body, Turn: -2,
		}
		defer s.record(rec)
		switch {
		case err != nil:
			rec.Answer = "unreadable"
			writeError(w, http.StatusBadRequest, "invalid_request_error", "fakellm: reading the body: "+err.Error(), nil)
			return
		case len(body) > MaxBody:
			rec.Body, rec.Answer = body[:MaxBody], "413"
			writeError(w, http.StatusRequestEntityTooLarge, "request_too_large", "fakellm: the body is larger than its limit", nil)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(s, w, r, rec)
	}
}

func (s *Server) record(rec *Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.Seq = len(s.reqs) + 1
	s.reqs = append(s.reqs, *rec)
}

// id is a fresh id with prefix: prefix + a number counting from 1 on this
// server ("msg_fake_0001").
func (s *Server) id(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[prefix]++
	return fmt.Sprintf("%s%04d", prefix, s.ids[prefix])
}

// delay waits d unless the request ends first; false when it did.
func delay(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// htmlPage is what a proxy or load balancer in front of an API answers.
const htmlPage = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><center><h1>502 Bad Gateway</h1></center><hr><center>fakellm</center></body></html>\n"

// writeHTML answers the HTML page with status (200 when 0).
func writeHTML(w http.ResponseWriter, status int) {
	if status == 0 {
		status = http.StatusOK
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", fmt.Sprint(len(htmlPage)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, htmlPage)
}

// cut ends the answer by dropping the connection: the client sees the
// stream end without its last events (net/http closes the connection on
// this panic without logging it).
func cut(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	panic(http.ErrAbortHandler)
}

// writeError answers an error in the shape both the Anthropic and the
// OpenAI clients read ({"type":"error","error":{"type","message"}}), with
// extra headers.
func writeError(w http.ResponseWriter, status int, typ, msg string, header map[string]string) {
	for k, v := range header {
		w.Header().Set(k, v)
	}
	b, _ := json.Marshal(map[string]any{
		"type":  "error",
		"error": map[string]string{"type": typ, "message": msg},
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
