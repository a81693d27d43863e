package fleet

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/secrets"
)

// Live logs: the output of a running job's engine goes to the coordinator
// while it runs, so that a person anywhere can follow it (aq job logs -f,
// the board). docs/fleet.md, "Live logs".
const (
	// LogChunkMax is the most content one chunk carries (after masking,
	// before gzip).
	LogChunkMax = 64 << 10
	// DefaultLogEvery is the flush cadence: a chunk about once a second
	// while output flows, nothing while the engine is silent.
	DefaultLogEvery = time.Second
	// DefaultLogBacklog bounds how far the stream may fall behind the log
	// (an outage, a burst): past it the oldest bytes become a gap record.
	DefaultLogBacklog = 1 << 20
	// logFinalBudget bounds the last flush at the job's end: the final
	// report does not wait longer for the live log (the artifact carries
	// the whole log).
	logFinalBudget = 5 * time.Second
	// logSendLimit bounds one chunk's call, retries included: the lease's
	// renewals wait for it.
	logSendLimit = 5 * time.Second
)

// LiveLogs streams the engine output of the jobs this factory runs.
//
// It follows the job's stdout.log under $AQ_HOME/logs/<id>/ — the log of
// record, written by engines.Exec through the redactor — from where the
// attempt began, so whatever the attempt writes there (any number of engine
// runs, each behind its "=== aq job … ===" header) is one stream, and the
// engine's output plumbing is left alone. The file is the backlog too:
// during an outage nothing is held in memory but the chunk being sent, and
// once the coordinator answers again what the stream is behind by is read
// from the file — at most Backlog bytes; older ones become a gap record.
type LiveLogs struct {
	Client   *Client
	LogsDir  string // $AQ_HOME/logs
	Redactor *secrets.Redactor
	Every    time.Duration // 0: DefaultLogEvery
	Backlog  int64         // 0: DefaultLogBacklog
	Log      *slog.Logger
}

// RunLease is what a live log needs of its run's lease (JobLease): chunks
// go on the wire one at a time with its renewals (Wire), none once it is
// gone; a chunk refused 409 fences it — learnt within a flush rather than
// at the next renewal.
type RunLease interface {
	Wire(ctx context.Context, call func()) bool
	Fenced() bool
	Fence(detail string) error
}

var _ RunLease = (*JobLease)(nil)

// Start streams the live log of claim c's run until Close; nil (whose
// Close does nothing) when the coordinator has no live log route. lease
// may be nil (no fencing but the coordinator's 409s).
func (l *LiveLogs) Start(ctx context.Context, c *Claim, lease RunLease, log *slog.Logger) *LogStream {
	if l == nil || !l.Client.Has(RouteLogAppend) {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &LogStream{l: l, jobID: c.Job.ID, attempt: c.Attempt(), epoch: c.LeaseEpoch, log: log, lease: lease,
		path: filepath.Join(l.LogsDir, c.Job.ID, "stdout.log")}
	if st, err := os.Stat(s.path); err == nil {
		s.pos = st.Size() // earlier attempts on this host: not this run's
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.quit = make(chan struct{})
	s.wg.Add(1)
	go s.loop(ctx)
	return s
}

func (l *LiveLogs) every() time.Duration {
	if l.Every > 0 {
		return l.Every
	}
	return DefaultLogEvery
}

func (l *LiveLogs) backlog() int64 {
	if l.Backlog > 0 {
		return max(l.Backlog, 2*LogChunkMax)
	}
	return DefaultLogBacklog
}

// LogStream is one run's live log. Its state is owned by one goroutine at
// a time: the flush loop, then Close.
type LogStream struct {
	l              *LiveLogs
	jobID, path    string
	attempt        int
	epoch          int64
	log            *slog.Logger
	lease          RunLease
	cancel         context.CancelFunc
	quit           chan struct{} // closed by Close: no flush after the one under way
	wg             sync.WaitGroup
	closeOnce      sync.Once
	mu             sync.Mutex // guards stats
	stats          LogStats
	pos, off, seq  int64       // the file position not yet in a chunk, its stream offset, the last seq
	queue          []*logChunk // built, not yet taken by the coordinator, in order
	marks          []logMark   // chunk boundaries: stream offset → file position (a resend)
	stopped, ended bool
	down           bool // the coordinator did not answer the last send (said once)
	gapSaid        bool // a gap was marked (said once)
	buf            []byte
}

// LogStats count what a stream sent.
type LogStats struct {
	Chunks   int   // chunks the coordinator took (gaps and the end included)
	Requests int   // requests sent
	Bytes    int64 // output bytes taken (after masking, before gzip)
	Gaps     int
	GapBytes int64
	Ended    bool   // the stream's end was taken
	Stopped  string // why the stream stopped early ("" if it did not)
}

// logChunk is a chunk built and its place in the file.
type logChunk struct {
	LogChunk
	filePos, fileLen int64 // the file bytes it stands for (-1: a gap the coordinator lost)
}

// logMark is where a chunk started or ended, in the stream and in the file.
type logMark struct{ off, pos int64 }

// maxMarks bounds the boundaries kept for a resend.
const maxMarks = 64

// Stats is what the stream sent so far.
func (s *LogStream) Stats() LogStats {
	if s == nil {
		return LogStats{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close stops the flush loop and, with flush (the run was not fenced),
// sends what the log gained since and the stream's end, within a few
// seconds: what does not go through is in the final artifact. A chunk on
// the wire when Close is called is let finish within that budget rather
// than cut off (cut off, the coordinator may have taken it and the last
// flush would only send it again); without flush it is cut off at once.
func (s *LogStream) Close(ctx context.Context, flush bool) LogStats {
	if s == nil {
		return LogStats{}
	}
	s.closeOnce.Do(func() {
		if flush {
			s.finish(ctx)
		} else {
			s.cancel()
			s.wg.Wait()
		}
		st := s.Stats()
		s.log.Debug("live log closed", "chunks", st.Chunks, "requests", st.Requests, "bytes", st.Bytes, "gaps", st.Gaps, "ended", st.Ended, "stopped", st.Stopped)
	})
	return s.Stats()
}

// finish lets the flush under way end and sends the rest, all within
// logFinalBudget.
func (s *LogStream) finish(ctx context.Context) {
	defer s.cancel()
	deadline := time.Now().Add(logFinalBudget)
	close(s.quit)
	cut := time.AfterFunc(logFinalBudget, s.cancel)
	s.wg.Wait()
	cut.Stop()
	if s.stopped {
		return
	}
	fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	s.tick(fctx, true)
}

// loop flushes at most once every Every: at once when the log grows after
// a quiet second (the log's size is looked at ten times a flush, which
// costs a stat and no request), else a second after the last flush — so a
// follower sees a sparse engine's line within a fraction of a second, and
// a chatty one's in a chunk a second.
func (s *LogStream) loop(ctx context.Context) {
	defer s.wg.Done()
	every := s.l.every()
	t := time.NewTicker(max(every/10, 10*time.Millisecond))
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.quit:
			return
		case <-t.C:
		}
		if time.Since(last) < every || !s.due() {
			continue
		}
		last = time.Now()
		s.tick(ctx, false)
		if s.stopped {
			return
		}
	}
}

// due reports whether a flush has something to do: a chunk waits, or the
// log grew.
func (s *LogStream) due() bool {
	if len(s.queue) > 0 {
		return true
	}
	size, err := s.size()
	return err != nil || size != s.pos
}

// tick sends what the log gained: one chunk, several only while the stream
// is more than half its backlog behind (or at the end, final), nothing when
// the log did not grow.
func (s *LogStream) tick(ctx context.Context, final bool) {
	// A bound on one flush's requests: the backlog's chunks, and a few
	// more for resends (a coordinator that keeps moving its answer does
	// not keep this loop spinning).
	for n := s.l.backlog()/LogChunkMax + 8; n > 0 && !s.stopped && ctx.Err() == nil; n-- {
		size, err := s.size()
		if err != nil {
			s.stop("cannot read the job's log: " + err.Error())
			return
		}
		if size < s.pos {
			s.stop(fmt.Sprintf("the job's log shrank from %d to %d bytes", s.pos, size))
			return
		}
		if err := s.cut(size); err != nil {
			s.stop("cannot read the job's log: " + err.Error())
			return
		}
		if len(s.queue) == 0 {
			c, err := s.next(size, final)
			if err != nil {
				s.stop("cannot read the job's log: " + err.Error())
				return
			}
			if c == nil {
				if !final || s.ended || s.seq == 0 {
					return // (a run that streamed nothing has no end to send)
				}
				c = s.chunk(LogOutput, 0, s.pos, 0) // the end, with nothing left
				c.End = true
			}
			s.queue = append(s.queue, c)
		}
		if !s.send(ctx) || s.ended {
			return
		}
		if !final && size-s.pos <= s.l.backlog()/2 && len(s.queue) == 0 {
			return
		}
	}
}

// size is the log's size (0 while it does not exist yet).
func (s *LogStream) size() (int64, error) {
	st, err := os.Stat(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// cut turns what the stream is behind by beyond its backlog into a gap:
// the output chunk not yet taken and the oldest unsent bytes, up to a line
// start a chunk before the log's end, where streaming resumes (a follower
// sees the gap, then the engine's latest lines). Gaps already queued stay
// ahead of it; one that ends where this one begins grows instead, so an
// outage of any length queues one gap.
func (s *LogStream) cut(size int64) error {
	from, off, i := s.pos, s.off, len(s.queue)
	for j, c := range s.queue {
		if c.Kind == LogOutput {
			from, off, i = c.filePos, c.Offset, j
			break
		}
	}
	b := s.l.backlog()
	if size-from <= b {
		return nil
	}
	to, err := s.lineStart(size-LogChunkMax, size)
	if err != nil {
		return err
	}
	s.queue, s.pos, s.off = s.queue[:i], from, off
	if n := len(s.queue); n > 0 && s.queue[n-1].Kind == LogGap && s.queue[n-1].filePos >= 0 && s.queue[n-1].filePos+s.queue[n-1].fileLen == from {
		g := s.queue[n-1]
		g.Size += to - from
		g.fileLen += to - from
		s.mark(g.Offset+g.Size, to)
		s.pos, s.off = to, g.Offset+g.Size
		return nil
	}
	g := s.chunk(LogGap, to-from, from, to-from)
	s.queue = append(s.queue, g)
	s.pos, s.off = to, g.Offset+g.Size
	if !s.gapSaid {
		s.gapSaid = true
		s.log.Warn("live log: the coordinator did not take the job's output in time; a gap is marked (the whole log is in the final artifact)",
			"job", s.jobID, "bytes", g.Size, "backlog", b)
	}
	return nil
}

// lineStart is the first line start at or after at (at when there is none
// within a chunk's length, or at the log's end).
func (s *LogStream) lineStart(at, size int64) (int64, error) {
	if at <= 0 || at >= size {
		return at, nil
	}
	f, err := os.Open(s.path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	b := make([]byte, min(size-at+1, LogChunkMax))
	n, err := f.ReadAt(b, at-1)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	if i := bytes.IndexByte(b[:n], '\n'); i >= 0 {
		return at + int64(i), nil
	}
	return at, nil
}

// next builds the chunk of what follows s.pos: at most LogChunkMax bytes,
// whole lines unless a line is longer or the log ends (final); nil when
// there is nothing (or only the start of a line) to send.
func (s *LogStream) next(size int64, final bool) (*logChunk, error) {
	n := min(size-s.pos, LogChunkMax)
	if n <= 0 {
		return nil, nil
	}
	if cap(s.buf) < LogChunkMax {
		s.buf = make([]byte, LogChunkMax)
	}
	b := s.buf[:n]
	f, err := os.Open(s.path)
	if err != nil {
		return nil, err
	}
	_, err = f.ReadAt(b, s.pos)
	f.Close()
	if err != nil {
		return nil, err
	}
	if !final || s.pos+n < size {
		i := bytes.LastIndexByte(b, '\n')
		switch {
		case i >= 0:
			b = b[:i+1]
		case n < LogChunkMax:
			return nil, nil // the start of a line: it goes when it ends
		}
	}
	content := b
	if s.l.Redactor != nil {
		// Written masked already; masked again for secrets learnt since
		// (as an artifact is). A mask is never longer than its secret.
		content = s.l.Redactor.Bytes(b)
	}
	data, err := gzipB64(content)
	if err != nil {
		return nil, err
	}
	c := s.chunk(LogOutput, int64(len(content)), s.pos, int64(len(b)))
	c.Encoding, c.Data = "gzip", data
	c.End = final && s.pos+int64(len(b)) == size
	s.pos, s.off = s.pos+int64(len(b)), s.off+c.Size
	return c, nil
}

// chunk numbers a new chunk at the stream's end and marks its boundaries.
func (s *LogStream) chunk(kind string, size, filePos, fileLen int64) *logChunk {
	s.seq++
	c := &logChunk{LogChunk: LogChunk{Attempt: s.attempt, LeaseEpoch: s.epoch, Seq: s.seq, Offset: s.off, Kind: kind, Size: size},
		filePos: filePos, fileLen: fileLen}
	s.mark(c.Offset, filePos)
	s.mark(c.Offset+size, filePos+fileLen)
	return c
}

func (s *LogStream) mark(off, pos int64) {
	for _, m := range s.marks {
		if m.off == off {
			return
		}
	}
	s.marks = append(s.marks, logMark{off, pos})
	if len(s.marks) > maxMarks {
		s.marks = s.marks[len(s.marks)-maxMarks:]
	}
}

// send offers the first chunk of the queue; it reports whether it was
// taken (the caller goes on). A run fenced meanwhile (a renewal's 409)
// sends nothing more.
func (s *LogStream) send(ctx context.Context) bool {
	if s.lease != nil && s.lease.Fenced() {
		s.stopped = true
		s.count(func(st *LogStats) { st.Stopped = "the run was fenced" })
		return false
	}
	c := s.queue[0]
	// Bounded, so a renewal never waits long behind a chunk (Wire).
	cctx, cancel := context.WithTimeout(ctx, logSendLimit)
	defer cancel()
	var (
		a   LogAppended
		err error
	)
	call := func() {
		a, err = s.l.Client.AppendLog(cctx, s.jobID, c.LogChunk)
		if IsFenced(err) && s.lease != nil {
			// Fenced before the wire is given back: a renewal waiting for it
			// sees the fence and is not sent.
			_ = s.lease.Fence("the coordinator refused the job's live log (409): " + err.Error())
		}
	}
	if s.lease == nil {
		call()
	} else if !s.lease.Wire(cctx, call) {
		if ctx.Err() == nil && cctx.Err() == nil {
			// The lease is gone (fenced, lost or ended): nothing more.
			s.stopped = true
			s.count(func(st *LogStats) { st.Stopped = "the run's lease is over" })
		}
		return false
	}
	s.count(func(st *LogStats) { st.Requests++ })
	var le *LogOffsetError
	switch {
	case err == nil && a.Next == c.Offset+c.Size:
		s.queue = s.queue[1:]
		s.count(func(st *LogStats) {
			st.Chunks++
			if c.Kind == LogGap {
				st.Gaps++
				st.GapBytes += c.Size
			} else {
				st.Bytes += c.Size
			}
			st.Ended = st.Ended || c.End
		})
		s.ended = s.ended || c.End
		if s.down {
			s.down = false
			s.log.Info("live log: the coordinator takes the job's output again", "job", s.jobID)
		}
		return true
	case err == nil:
		s.resync(a.Next, "a chunk taken")
		return !s.stopped
	case errors.As(err, &le):
		s.resync(le.Next, "416")
		return !s.stopped
	case IsTransient(err) || ctx.Err() != nil:
		// Kept: the next flush sends it again (a re-send is a no-op).
		if !s.down && ctx.Err() == nil {
			s.down = true
			s.log.Warn("live log: the coordinator does not answer; the job's output waits (the whole log is in the final artifact)", "job", s.jobID, "err", err)
		}
		return false
	case IsFenced(err): // the run is fenced already (call)
		s.stop("the coordinator refused it (409): this factory no longer holds the job")
	case IsRouteAbsent(err):
		s.stopped = true // the client said it once, with what aq does instead
		s.count(func(st *LogStats) { st.Stopped = err.Error() })
	default: // refused (4xx), credentials refused, or an answer that is not the contract's
		s.stop(err.Error())
	}
	return false
}

// resync follows the coordinator to where its copy of the stream ends
// (next): from a chunk boundary this factory knows, the bytes are read
// again from the log (the backlog bound holds: cut); behind the queue's
// first chunk without a known boundary, what it lost is a gap.
func (s *LogStream) resync(next int64, why string) {
	head := s.queue[0]
	for _, m := range s.marks {
		if m.off == next && m.pos >= 0 && next != head.Offset {
			s.pos, s.off, s.queue = m.pos, next, nil
			s.marks = dropMarksAfter(s.marks, next)
			s.log.Info("live log: resending from where the coordinator's copy ends", "job", s.jobID, "offset", next, "why", why)
			return
		}
	}
	if next < head.Offset {
		s.seq++
		g := &logChunk{LogChunk: LogChunk{Attempt: s.attempt, LeaseEpoch: s.epoch, Seq: s.seq, Offset: next, Kind: LogGap, Size: head.Offset - next},
			filePos: -1}
		s.queue = append([]*logChunk{g}, s.queue...)
		s.gapSaid = true
		s.log.Warn("live log: the coordinator lost part of the job's output; a gap is marked (the whole log is in the final artifact)",
			"job", s.jobID, "bytes", g.Size)
		return
	}
	s.stop(fmt.Sprintf("the coordinator's copy of the stream ends at %d, which this factory did not send (%s at %d)", next, why, head.Offset))
}

func dropMarksAfter(ms []logMark, off int64) []logMark {
	out := ms[:0]
	for _, m := range ms {
		if m.off <= off {
			out = append(out, m)
		}
	}
	return out
}

// stop ends the stream for good, saying why once; the job goes on and its
// final artifact carries the whole log.
func (s *LogStream) stop(why string) {
	if s.stopped {
		return
	}
	s.stopped = true
	s.count(func(st *LogStats) { st.Stopped = why })
	s.log.Warn("live log of the job stopped: "+why+"; the job goes on, and its final artifact carries the whole log", "job", s.jobID)
}

func (s *LogStream) count(fn func(*LogStats)) {
	s.mu.Lock()
	fn(&s.stats)
	s.mu.Unlock()
}

// gzipB64 is b gzipped (fastest level: a chunk a second per job) and
// base64-encoded.
func gzipB64(b []byte) (string, error) {
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(b); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

var gzipWriters = sync.Pool{New: func() any {
	zw, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
	return zw
}}
