package fleet

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/aqfleet/aq/internal/secrets"
)

// DefaultArtifactCap is the most content one artifact carries (after
// masking, before gzip): 8 MiB. A longer log keeps its first quarter and its
// end, with a marker line where the middle was cut (docs/fleet.md).
const DefaultArtifactCap = 8 << 20

// Artifacts uploads a job's logs to the coordinator at each terminal report
// (POST /fleet/jobs/:id/artifacts): the engine's output (the transcript),
// its stderr, the verify log and a devin trajectory, each masked with the
// redactor, capped, gzipped. An upload the coordinator cannot take now goes
// to the artifact spool (a Spool of its own, drained by a Reporter of its
// own: uploads never hold up a stage report); a coordinator without the
// route skips them all with one warning.
type Artifacts struct {
	Reporter *Reporter // over $AQ_HOME/spool/artifacts
	LogsDir  string    // $AQ_HOME/logs: a job's files are in LogsDir/<id>
	Redactor *secrets.Redactor
	// MaxBytes caps each artifact (0: DefaultArtifactCap).
	MaxBytes int64
	Log      *slog.Logger
}

// artifactFile is a log file of a job and how it is published.
type artifactFile struct {
	file, name, kind string
}

// jobArtifacts are the files uploaded, when present.
var jobArtifacts = []artifactFile{
	{"stdout.log", "engine-stdout", "transcript"},
	{"stderr.log", "engine-stderr", "log"},
	{"verify.log", "verify", "log"},
}

// Upload builds the job's artifacts and sends each (try then spool); with
// spoolOnly (the final report itself was spooled: the coordinator is away)
// they go to the spool at once. It returns what became of each, by name.
func (a *Artifacts) Upload(ctx context.Context, jobID string, epoch int64, attempt int, spoolOnly bool) map[string]Delivery {
	ups, err := a.Build(jobID, epoch, attempt)
	if err != nil {
		a.log().Warn("cannot read the job's logs for upload", "job", jobID, "err", err)
	}
	out := map[string]Delivery{}
	for _, up := range ups {
		rep := ArtifactReport(jobID, up)
		if spoolOnly {
			out[up.Name] = a.Reporter.spool(a.log().With("job", jobID, "artifact", up.Name), rep, errors.New("the final report is spooled: the coordinator is unavailable"))
			continue
		}
		d := a.Reporter.Send(ctx, rep)
		out[up.Name] = d
		if d.Skipped {
			break // no route: the others would be skipped too
		}
	}
	return out
}

// Build reads the job's log files into uploads: masked, capped, gzipped.
func (a *Artifacts) Build(jobID string, epoch int64, attempt int) ([]ArtifactUpload, error) {
	dir := filepath.Join(a.LogsDir, jobID)
	files := append([]artifactFile{}, jobArtifacts...)
	if m, _ := filepath.Glob(filepath.Join(dir, "devin-trajectory-*.json")); len(m) > 0 {
		sort.Strings(m)
		for _, p := range m {
			n := strings.TrimSuffix(filepath.Base(p), ".json")
			files = append(files, artifactFile{filepath.Base(p), n, "transcript"})
		}
	}
	var (
		out  []ArtifactUpload
		errs []error
	)
	for _, f := range files {
		content, orig, truncated, err := readCapped(filepath.Join(dir, f.file), a.cap(), a.Redactor)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		up, err := encodeArtifact(f, content, orig, truncated)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		up.Attempt, up.LeaseEpoch = attempt, epoch
		out = append(out, up)
	}
	return out, errors.Join(errs...)
}

func encodeArtifact(f artifactFile, content []byte, orig int64, truncated bool) (ArtifactUpload, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(content); err != nil {
		return ArtifactUpload{}, err
	}
	if err := zw.Close(); err != nil {
		return ArtifactUpload{}, err
	}
	sum := sha256.Sum256(content)
	return ArtifactUpload{
		Name: f.name, Kind: f.kind, ContentType: contentType(f.file, content), Encoding: "gzip",
		Size: int64(len(content)), OriginalSize: orig, Truncated: truncated, SHA256: hex.EncodeToString(sum[:]),
		Data: base64.StdEncoding.EncodeToString(buf.Bytes()),
	}, nil
}

// contentType: JSON lines for an engine's event stream, JSON for a
// trajectory, text otherwise.
func contentType(file string, content []byte) string {
	switch {
	case strings.HasSuffix(file, ".json"):
		return "application/json"
	case file == "stdout.log":
		for _, l := range bytes.Split(content, []byte("\n")) {
			l = bytes.TrimSpace(l)
			if len(l) == 0 || bytes.HasPrefix(l, []byte("=== aq job ")) {
				continue
			}
			if l[0] == '{' {
				return "application/x-ndjson"
			}
			break
		}
	}
	return "text/plain; charset=utf-8"
}

// TruncationMarker is the line that replaces what a capped artifact left
// out; %d is the number of bytes cut.
const TruncationMarker = "\n[aq: %d bytes cut here: an artifact carries at most %d bytes — the first quarter and the end of the log; the whole log stays on the factory in $AQ_HOME/logs]\n"

// readCapped reads path masked by red; a file longer than max keeps its
// first quarter and its end around a marker, max bytes in all. It reads
// only what it keeps (plus the redactor's longest secret at each cut, so a
// secret across a cut is still masked) and returns the content, the file's
// size and whether it was cut.
func readCapped(path string, limit int64, red *secrets.Redactor) ([]byte, int64, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, false, err
	}
	size := st.Size()
	mask := func(b []byte) []byte {
		if red == nil {
			return b
		}
		return red.Bytes(b)
	}
	if size <= limit {
		b, err := io.ReadAll(io.LimitReader(f, limit))
		if err != nil {
			return nil, size, false, err
		}
		if m := mask(b); int64(len(m)) <= limit {
			return m, size, false, nil
		}
		// Masking made it longer than the cap (rare): cut it as below.
		return cutMiddle(mask(b), size, limit), size, true, nil
	}
	pad := int64(64)
	if red != nil {
		pad += int64(red.MaxLen())
	}
	marker := int64(len(fmt.Sprintf(TruncationMarker, size, limit)))
	headN := (limit - marker) / 4
	tailN := limit - marker - headN
	head := make([]byte, min(headN+pad, size))
	if _, err := io.ReadFull(f, head); err != nil {
		return nil, size, false, err
	}
	tailFrom := max64(0, size-tailN-pad)
	tail := make([]byte, size-tailFrom)
	if _, err := f.ReadAt(tail, tailFrom); err != nil && !errors.Is(err, io.EOF) {
		return nil, size, false, err
	}
	h, t := mask(head), mask(tail)
	h = h[:min(int64(len(h)), headN)]
	t = t[max64(0, int64(len(t))-tailN):]
	cut := size - int64(len(h)) - int64(len(t))
	out := make([]byte, 0, limit)
	out = append(out, h...)
	out = fmt.Appendf(out, TruncationMarker, cut, limit)
	out = append(out, t...)
	return out, size, true, nil
}

// cutMiddle is readCapped's cut of content already in memory.
func cutMiddle(b []byte, size, limit int64) []byte {
	marker := int64(len(fmt.Sprintf(TruncationMarker, size, limit)))
	headN := (limit - marker) / 4
	tailN := limit - marker - headN
	cut := int64(len(b)) - headN - tailN
	out := append([]byte{}, b[:headN]...)
	out = fmt.Appendf(out, TruncationMarker, cut, limit)
	return append(out, b[int64(len(b))-tailN:]...)
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func (a *Artifacts) cap() int64 {
	if a.MaxBytes > 0 {
		return a.MaxBytes
	}
	return DefaultArtifactCap
}

func (a *Artifacts) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.New(slog.DiscardHandler)
}

// uploadBudget bounds the uploads after one job's final report: uploads
// that do not go through within it wait in the artifact spool.
func (a *Artifacts) uploadBudget() time.Duration {
	b := a.Reporter.Client.Budgets().Report
	if b <= 0 {
		b = 30 * time.Second
	}
	return b
}
