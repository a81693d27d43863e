package coord

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Live logs (docs/fleet.md, "Live logs"): a running job's factory appends
// chunks of its engine's output, fenced by the lease epoch, idempotent by
// sequence number and offset; anyone with a token reads them from an offset,
// long-polled. A job's log is a list of runs, one per lease epoch that
// streamed; each run's stream counts bytes from 0 and holds output and gap
// records. With a state file the runs are kept on disk beside it (every
// chunk fsynced before its 200), so a restarted stub loses nothing it
// acknowledged; bounded per job (a job's older runs go first) and in all
// (the oldest jobs' logs go first).

// Routes of the live log.
const (
	RouteLogAppend = "POST /fleet/jobs/{id}/log"
	RouteLogRead   = "GET /fleet/jobs/{id}/log"
)

// Limits of the live log.
const (
	// MaxLogChunk is the most content a chunk may carry (the contract's
	// 64 KiB).
	MaxLogChunk = 64 << 10
	// maxLogBody bounds a chunk's request body (64 KiB incompressible,
	// gzipped, base64, plus the fields).
	maxLogBody = 256 << 10
	// DefaultLogJobCap and DefaultLogCap bound the output kept per job
	// and in all.
	DefaultLogJobCap = 64 << 20
	DefaultLogCap    = 1 << 30
	// maxLogPage bounds the text of one read.
	maxLogPage = 1 << 20
	// maxLogWait bounds a long poll.
	maxLogWait = 30 * time.Second
)

// LogChunk is the body of POST /fleet/jobs/:id/log.
type LogChunk struct {
	Attempt    int    `json:"attempt"`
	LeaseEpoch int64  `json:"leaseEpoch"`
	FactoryID  string `json:"factoryId"`
	Seq        int64  `json:"seq"`
	Offset     int64  `json:"offset"`
	Kind       string `json:"kind"` // output | gap
	Size       int64  `json:"size"`
	Encoding   string `json:"encoding,omitempty"`
	Data       string `json:"data,omitempty"`
	End        bool   `json:"end,omitempty"`
}

// LogPage is the answer of GET /fleet/jobs/:id/log.
type LogPage struct {
	JobID      string      `json:"jobId"`
	Attempt    int         `json:"attempt"`
	LeaseEpoch int64       `json:"leaseEpoch"`
	FactoryID  string      `json:"factoryId,omitempty"`
	Offset     int64       `json:"offset"`
	Next       int64       `json:"next"`
	Records    []LogRecord `json:"records"`
	Ended      bool        `json:"ended"`
	Runs       []LogRun    `json:"runs"`
}

// LogRecord is one stretch of a run's stream.
type LogRecord struct {
	Offset int64  `json:"offset"`
	Kind   string `json:"kind"`
	Size   int64  `json:"size"`
	Text   string `json:"text,omitempty"`
}

// LogRun is one run of a job with a live log.
type LogRun struct {
	Attempt    int       `json:"attempt"`
	LeaseEpoch int64     `json:"leaseEpoch"`
	FactoryID  string    `json:"factoryId,omitempty"`
	Size       int64     `json:"size"`
	Ended      bool      `json:"ended"`
	StartedAt  time.Time `json:"startedAt"`
}

// logStore holds every job's live log: in memory, or on disk under dir.
type logStore struct {
	mu     sync.Mutex
	dir    string // "" : memory only
	jobs   map[string]*jobLog
	used   int64 // output bytes held, in all
	perJob int64
	total  int64
	wake   chan struct{} // closed and replaced at every change: long polls wake
	polls  atomic.Int64  // long polls that began to wait (tests)
}

type jobLog struct {
	runs    []*runLog // oldest first
	used    int64
	created time.Time // the job's creation: the oldest jobs' logs go first
}

// runLog is one run's stream.
type runLog struct {
	head  runHead
	next  int64
	ended bool // its writer sent the end
	recs  []logRec
	used  int64
	mem   []byte // memory mode: the output bytes, in order
	file  string // disk mode: the run's record file
	fsize int64
}

// runHead is what a run is (the first line of its file).
type runHead struct {
	Attempt   int       `json:"attempt"`
	Epoch     int64     `json:"leaseEpoch"`
	Factory   string    `json:"factoryId"`
	StartedAt time.Time `json:"startedAt"`
}

// logRec is one record: its place in the stream, and its bytes' place in
// mem or the file.
type logRec struct {
	Seq    int64  `json:"seq"`
	Offset int64  `json:"offset"`
	Kind   string `json:"kind"`
	Size   int64  `json:"size"`
	End    bool   `json:"end,omitempty"`
	at     int64
}

func newLogStore(dir string, perJob, total int64) (*logStore, error) {
	if total <= 0 {
		total = DefaultLogCap
	}
	if perJob <= 0 {
		perJob = DefaultLogJobCap
	}
	l := &logStore{dir: dir, jobs: map[string]*jobLog{}, perJob: min(perJob, total), total: total, wake: make(chan struct{})}
	if dir == "" {
		return l, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("live log store %s: %w", dir, err)
	}
	if err := l.load(); err != nil {
		return nil, err
	}
	return l, nil
}

// load reads every run file under dir; a record cut short by a crash (its
// 200 never sent) is dropped from the file.
func (l *logStore) load() error {
	jobs, err := os.ReadDir(l.dir)
	if err != nil {
		return err
	}
	for _, je := range jobs {
		if !je.IsDir() || !validID(je.Name()) {
			continue
		}
		files, err := filepath.Glob(filepath.Join(l.dir, je.Name(), "*.log"))
		if err != nil {
			return err
		}
		jl := &jobLog{}
		for _, f := range files {
			r, err := loadRun(f)
			if err != nil {
				return fmt.Errorf("live log %s: %w", f, err)
			}
			if r == nil {
				continue
			}
			jl.runs = append(jl.runs, r)
			jl.used += r.used
		}
		if len(jl.runs) == 0 {
			continue
		}
		sort.Slice(jl.runs, func(a, b int) bool { return jl.runs[a].head.Epoch < jl.runs[b].head.Epoch })
		jl.created = jl.runs[0].head.StartedAt
		l.jobs[je.Name()] = jl
		l.used += jl.used
	}
	return nil
}

// loadRun reads a run file: its head line, then records (a JSON line, then
// the record's bytes for output).
func loadRun(path string) (*runLog, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return nil, nil // not even a head: a run that never took a chunk
	}
	r := &runLog{file: path}
	if err := json.Unmarshal(line, &r.head); err != nil {
		return nil, fmt.Errorf("its head is not JSON: %w", err)
	}
	good := int64(len(line))
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			break
		}
		var rec logRec
		if json.Unmarshal(line, &rec) != nil || rec.Offset != r.next {
			break
		}
		rec.at = good + int64(len(line))
		if rec.Kind == "output" {
			if _, err := br.Discard(int(rec.Size)); err != nil {
				break
			}
			r.used += rec.Size
		}
		good = rec.at
		if rec.Kind == "output" {
			good += rec.Size
		}
		r.recs = append(r.recs, rec)
		r.next += rec.Size
		r.ended = r.ended || rec.End
	}
	if err := f.Truncate(good); err != nil {
		return nil, err
	}
	r.fsize = good
	return r, nil
}

// kick wakes the long polls (after a chunk, or a change of a job).
func (l *logStore) kick() {
	l.mu.Lock()
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// appendOutcome is what append decided.
type appendOutcome struct {
	next      int64
	duplicate bool
	code      int // 0: taken; else the status to answer (with msg)
	msg       string
}

// append adds ch (content: its output, gunzipped) to job id's run at
// ch.LeaseEpoch. The caller has checked the lease.
func (l *logStore) append(id string, created time.Time, ch LogChunk, content []byte, factory string, now time.Time) appendOutcome {
	l.mu.Lock()
	defer func() {
		close(l.wake)
		l.wake = make(chan struct{})
		l.mu.Unlock()
	}()
	jl := l.jobs[id]
	if jl == nil {
		jl = &jobLog{created: created}
		l.jobs[id] = jl
	}
	var r *runLog
	for _, x := range jl.runs {
		if x.head.Epoch == ch.LeaseEpoch {
			r = x
		}
	}
	if r == nil {
		if ch.Offset != 0 {
			return appendOutcome{code: http.StatusRequestedRangeNotSatisfiable, msg: fmt.Sprintf("the live log of run %d holds nothing: start at offset 0", ch.LeaseEpoch)}
		}
		r = &runLog{head: runHead{Attempt: ch.Attempt, Epoch: ch.LeaseEpoch, Factory: factory, StartedAt: now}}
		if l.dir != "" {
			r.file = filepath.Join(l.dir, id, strconv.FormatInt(ch.LeaseEpoch, 10)+".log")
		}
	}
	for _, rec := range r.recs {
		if rec.Seq == ch.Seq && rec.Offset == ch.Offset && rec.Size == ch.Size && rec.Kind == ch.Kind {
			if ch.End && rec.Offset+rec.Size == r.next {
				r.ended = true
			}
			return appendOutcome{next: r.next, duplicate: true}
		}
	}
	if ch.Offset != r.next {
		return appendOutcome{next: r.next, code: http.StatusRequestedRangeNotSatisfiable,
			msg: fmt.Sprintf("offset %d does not follow the live log of run %d, which ends at %d", ch.Offset, ch.LeaseEpoch, r.next)}
	}
	if ch.Kind == "output" && r.used+ch.Size > l.perJob {
		return appendOutcome{next: r.next, code: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("the live log of job %s is at its cap (%d bytes); the rest is in the job's final artifact", id, l.perJob)}
	}
	rec := logRec{Seq: ch.Seq, Offset: ch.Offset, Kind: ch.Kind, Size: ch.Size, End: ch.End}
	if err := l.write(id, r, &rec, content); err != nil {
		return appendOutcome{next: r.next, code: http.StatusInternalServerError, msg: "cannot keep the chunk: " + err.Error()}
	}
	if !slices.Contains(jl.runs, r) {
		jl.runs = append(jl.runs, r)
		sort.Slice(jl.runs, func(a, b int) bool { return jl.runs[a].head.Epoch < jl.runs[b].head.Epoch })
	}
	r.recs = append(r.recs, rec)
	r.next += ch.Size
	r.ended = r.ended || ch.End
	if ch.Kind == "output" {
		r.used += ch.Size
		jl.used += ch.Size
		l.used += ch.Size
	}
	l.prune(id, jl, r)
	return appendOutcome{next: r.next}
}

// write keeps a record: in memory, or appended to the run's file and
// fsynced (the file and its directory created with the run's head first).
func (l *logStore) write(id string, r *runLog, rec *logRec, content []byte) error {
	if l.dir == "" {
		rec.at = int64(len(r.mem))
		r.mem = append(r.mem, content...)
		return nil
	}
	var buf bytes.Buffer
	if r.fsize == 0 {
		if err := os.MkdirAll(filepath.Join(l.dir, id), 0o700); err != nil {
			return err
		}
		h, _ := json.Marshal(r.head)
		buf.Write(h)
		buf.WriteByte('\n')
	}
	line, _ := json.Marshal(rec)
	buf.Write(line)
	buf.WriteByte('\n')
	at := r.fsize + int64(buf.Len())
	buf.Write(content)
	f, err := os.OpenFile(r.file, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(buf.Bytes(), r.fsize)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if r.fsize == 0 {
		syncDir(filepath.Join(l.dir, id))
		syncDir(l.dir)
	}
	rec.at = at
	r.fsize += int64(buf.Len())
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// prune keeps the bounds: a job over its cap loses its oldest runs (never
// the one being written, cur); over the total, the oldest jobs lose their
// logs first (never job id's).
func (l *logStore) prune(id string, jl *jobLog, cur *runLog) {
	for jl.used > l.perJob && len(jl.runs) > 1 {
		old := jl.runs[0]
		if old == cur {
			break
		}
		jl.runs = jl.runs[1:]
		l.dropRun(jl, old)
	}
	for l.used > l.total {
		var oldest string
		for jid, x := range l.jobs {
			if jid == id || x.used == 0 {
				continue
			}
			if oldest == "" || x.created.Before(l.jobs[oldest].created) || x.created.Equal(l.jobs[oldest].created) && jid < oldest {
				oldest = jid
			}
		}
		if oldest == "" {
			return
		}
		x := l.jobs[oldest]
		for _, r := range x.runs {
			l.dropRun(x, r)
		}
		delete(l.jobs, oldest)
		if l.dir != "" {
			_ = os.RemoveAll(filepath.Join(l.dir, oldest))
		}
	}
}

// remove forgets job id's live log (the job was removed).
func (l *logStore) remove(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	jl := l.jobs[id]
	if jl == nil {
		return
	}
	for _, r := range jl.runs {
		l.dropRun(jl, r)
	}
	delete(l.jobs, id)
	if l.dir != "" {
		_ = os.RemoveAll(filepath.Join(l.dir, id))
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

func (l *logStore) dropRun(jl *jobLog, r *runLog) {
	jl.used -= r.used
	l.used -= r.used
	if r.file != "" {
		_ = os.Remove(r.file)
	}
}

// page reads run epoch (0: the latest) of job id from offset, at most
// maxLogPage bytes of text. ended tells whether the job's lease is no
// longer at a run's epoch (its run is over). It also returns the channel
// that closes at the next change.
func (l *logStore) page(id string, epoch, offset int64, over func(epoch int64) bool) (LogPage, <-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := LogPage{JobID: id, Records: []LogRecord{}, Runs: []LogRun{}}
	jl := l.jobs[id]
	var r *runLog
	if jl != nil {
		for i, x := range jl.runs {
			ended := x.ended || i < len(jl.runs)-1 || over(x.head.Epoch)
			p.Runs = append(p.Runs, LogRun{Attempt: x.head.Attempt, LeaseEpoch: x.head.Epoch, FactoryID: x.head.Factory, Size: x.next, Ended: ended, StartedAt: x.head.StartedAt})
			if epoch == 0 || x.head.Epoch == epoch {
				r = x
			}
		}
	}
	if r == nil {
		if epoch > 0 {
			// A run that never streamed (or whose log was pruned): nothing
			// will come of it once its lease is over.
			p.LeaseEpoch, p.Ended = epoch, over(epoch)
		}
		return p, l.wake, nil
	}
	p.Attempt, p.LeaseEpoch, p.FactoryID = r.head.Attempt, r.head.Epoch, r.head.Factory
	for _, x := range p.Runs {
		if x.LeaseEpoch == r.head.Epoch {
			p.Ended = x.Ended
		}
	}
	offset = min(max(offset, 0), r.next)
	p.Offset, p.Next = offset, offset
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	text := 0
	for _, rec := range r.recs {
		if rec.Size == 0 || rec.Offset+rec.Size <= offset {
			continue
		}
		skip := max(offset-rec.Offset, 0)
		out := LogRecord{Offset: rec.Offset + skip, Kind: rec.Kind, Size: rec.Size - skip}
		if rec.Kind == "output" {
			n := min(out.Size, int64(maxLogPage-text))
			if n <= 0 {
				break
			}
			b := make([]byte, n)
			if r.file == "" {
				copy(b, r.mem[rec.at+skip:])
			} else {
				if f == nil {
					var err error
					if f, err = os.Open(r.file); err != nil {
						return p, l.wake, err
					}
				}
				if _, err := f.ReadAt(b, rec.at+skip); err != nil {
					return p, l.wake, err
				}
			}
			out.Size, out.Text = n, string(b)
			text += int(n)
		}
		p.Records = append(p.Records, out)
		p.Next = out.Offset + out.Size
		if text >= maxLogPage {
			break
		}
	}
	if p.Next < r.next {
		p.Ended = false // more to read before the end
	}
	return p, l.wake, nil
}

// ---- handlers ----

// handleLogAppend takes a chunk of a running job's live log: only from the
// lease's holder at the current epoch (else 409, recorded as a fenced
// call); a re-sent chunk (same seq and offset) is answered 200 without
// being stored twice; an offset that does not follow the run's stream is
// answered 416 with where it ends.
func (s *Server) handleLogAppend(w http.ResponseWriter, r *http.Request, c who) {
	id := r.PathValue("id")
	body, err := io.ReadAll(io.LimitReader(r.Body, maxLogBody+1))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "cannot read the body")
		return
	}
	if len(body) > maxLogBody {
		writeErr(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("a live log chunk's body is at most %d bytes", maxLogBody))
		return
	}
	var ch LogChunk
	if err := json.Unmarshal(body, &ch); err != nil {
		writeErr(w, http.StatusBadRequest, "the body is not valid JSON: "+err.Error())
		return
	}
	if !sameFactory(w, c, ch.FactoryID) {
		return
	}
	content, code, msg := checkChunk(&ch)
	if code != 0 {
		writeErr(w, code, msg)
		return
	}
	// The lease is checked and the chunk kept under the store's lock, so
	// no requeue or reap slips in between: a chunk of a fenced run is
	// never kept.
	s.st.mu.Lock()
	jp, ok := s.st.st.Jobs[id]
	if !ok {
		s.st.mu.Unlock()
		writeErr(w, http.StatusNotFound, "no job "+id)
		return
	}
	j := cloneJob(jp)
	rc := Call{Route: RouteLogAppend, JobID: id, Factory: c.factory, Epoch: ch.LeaseEpoch, JobEpoch: j.LeaseEpoch, Holder: j.Holder, Stage: j.Stage, Attempts: j.Attempts}
	epoch := ch.LeaseEpoch
	if s.broken(BreakLogStaleEpoch) && j.held() && j.Holder == c.factory {
		epoch = j.LeaseEpoch // the break: a stale epoch taken as current
	}
	if why := holds(&j, c.factory, epoch); why != "" {
		s.st.mu.Unlock()
		rc.Status = http.StatusConflict
		s.call(rc)
		s.fenced(w, j, RouteLogAppend, c.factory, ch.LeaseEpoch, why)
		return
	}
	out := s.logs.append(id, j.CreatedAt, ch, content, c.factory, s.o.Now().UTC())
	s.st.mu.Unlock()
	if out.code != 0 {
		rc.Status = out.code
		s.call(rc)
		if out.code == http.StatusRequestedRangeNotSatisfiable {
			writeJSON(w, out.code, map[string]any{"error": out.msg, "next": out.next})
			return
		}
		writeErr(w, out.code, out.msg)
		return
	}
	rc.Status, rc.Resend = http.StatusOK, out.duplicate
	s.call(rc)
	writeJSON(w, http.StatusOK, map[string]any{"next": out.next, "duplicate": out.duplicate})
}

// checkChunk validates a chunk and returns its content (output, gunzipped).
func checkChunk(ch *LogChunk) ([]byte, int, string) {
	switch {
	case ch.LeaseEpoch <= 0:
		return nil, http.StatusBadRequest, "leaseEpoch is missing"
	case ch.Seq <= 0:
		return nil, http.StatusBadRequest, "seq is missing (chunks are numbered from 1)"
	case ch.Offset < 0 || ch.Size < 0:
		return nil, http.StatusBadRequest, "offset and size are byte counts (0 or more)"
	}
	switch ch.Kind {
	case "gap":
		if ch.Size == 0 || ch.Data != "" {
			return nil, http.StatusBadRequest, "a gap has a size and no data"
		}
		return nil, 0, ""
	case "output":
	default:
		return nil, http.StatusBadRequest, fmt.Sprintf("kind %q: a chunk is output or gap", ch.Kind)
	}
	if ch.Size > MaxLogChunk {
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("a chunk carries at most %d bytes of output", MaxLogChunk)
	}
	if ch.Size == 0 && ch.Data == "" {
		return nil, 0, "" // an end with nothing more
	}
	if ch.Encoding != "gzip" {
		return nil, http.StatusBadRequest, fmt.Sprintf("encoding %q: only gzip is taken", ch.Encoding)
	}
	gz, err := base64.StdEncoding.DecodeString(ch.Data)
	if err != nil {
		return nil, http.StatusBadRequest, "data is not base64: " + err.Error()
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	var content []byte
	if err == nil {
		content, err = io.ReadAll(io.LimitReader(zr, MaxLogChunk+1))
	}
	if err != nil {
		return nil, http.StatusBadRequest, "data is not gzip: " + err.Error()
	}
	if int64(len(content)) != ch.Size {
		return nil, http.StatusBadRequest, fmt.Sprintf("size %d declared, %d received", ch.Size, len(content))
	}
	return content, 0, ""
}

// handleLogRead answers a run's records from an offset: the latest run
// unless ?epoch= names one; with ?wait=S (seconds, at most 30) it holds the
// answer until the run has bytes past the offset, ends, or S passes.
func (s *Server) handleLogRead(w http.ResponseWriter, r *http.Request, _ who) {
	id := r.PathValue("id")
	if _, ok := s.st.job(id); !ok {
		writeErr(w, http.StatusNotFound, "no job "+id)
		return
	}
	q := r.URL.Query()
	num := func(k string) (int64, bool) {
		v := q.Get(k)
		if v == "" {
			return 0, true
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil && n >= 0
	}
	epoch, ok1 := num("epoch")
	offset, ok2 := num("offset")
	var wait time.Duration
	ok3 := true
	if v := q.Get("wait"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		ok3 = err == nil && f >= 0
		wait = min(time.Duration(f*float64(time.Second)), maxLogWait)
	}
	if !ok1 || !ok2 || !ok3 {
		writeErr(w, http.StatusBadRequest, "epoch and offset are whole numbers (0 or more), wait seconds")
		return
	}
	deadline := time.Now().Add(wait)
	for {
		j, _ := s.st.job(id)
		over := func(e int64) bool { return j.LeaseEpoch != e || !j.held() }
		p, changed, err := s.logs.page(id, epoch, offset, over)
		if err != nil {
			writeErr(w, http.StatusInternalServerError, "cannot read the live log: "+err.Error())
			return
		}
		left := time.Until(deadline)
		if len(p.Records) > 0 || p.Ended || left <= 0 {
			writeJSON(w, http.StatusOK, p)
			return
		}
		s.logs.polls.Add(1)
		t := time.NewTimer(left)
		select {
		case <-changed:
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// LogText is job id's live log of run epoch (0: the latest) as the stub
// holds it: the output, with each gap as a line "[gap N]".
func (s *Server) LogText(id string, epoch int64) (string, []LogRun) {
	var b strings.Builder
	var runs []LogRun
	offset := int64(0)
	for {
		j, _ := s.st.job(id)
		p, _, err := s.logs.page(id, epoch, offset, func(e int64) bool { return j.LeaseEpoch != e || !j.held() })
		if err != nil {
			return b.String(), p.Runs
		}
		runs = p.Runs
		for _, r := range p.Records {
			if r.Kind == "gap" {
				fmt.Fprintf(&b, "[gap %d]", r.Size)
				continue
			}
			b.WriteString(r.Text)
		}
		if p.Next == offset {
			return b.String(), runs
		}
		offset = p.Next
	}
}

// LogDir is where the stub keeps live logs (logs/<job>/<epoch>.log) and
// artifacts (artifacts/) beside its state file: "" without one.
func LogDir(stateFile string) string {
	if stateFile == "" {
		return ""
	}
	return stateFile + ".d"
}

func subdir(dir, name string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, name)
}
