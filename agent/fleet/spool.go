package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/job"
	"github.com/gofrs/flock"
)

// Report kinds.
const (
	KindPatch = "patch" // PATCH /fleet/jobs/:id
	KindFail  = "fail"  // POST /fleet/fail
	// KindArtifact is an upload (POST /fleet/jobs/:id/artifacts). Artifacts
	// wait in a spool of their own ($AQ_HOME/spool/artifacts), drained by a
	// Reporter of their own: they never hold up a stage report.
	KindArtifact = "artifact"
)

// Report is one stage report for the coordinator, as the spool keeps it
// until it is delivered or fenced. Field names are stable (docs/fleet.md).
type Report struct {
	V          int           `json:"v"` // format version: 1
	Seq        int64         `json:"seq"`
	Kind       string        `json:"kind"`
	JobID      string        `json:"jobId"`
	LeaseEpoch int64         `json:"leaseEpoch"`
	Patch      *PatchRequest `json:"patch,omitempty"`
	Fail       *FailRequest  `json:"fail,omitempty"`
	// Artifact is an upload, its content already masked, capped and
	// gzipped.
	Artifact  *ArtifactUpload `json:"artifact,omitempty"`
	CreatedAt time.Time       `json:"createdAt"`
	// Exhausted: a failure of a job with no retries left (its manifest's
	// policy at this attempt). /fleet/fail leaves that to the coordinator;
	// without the route, the fallback PATCH says failed rather than queued.
	Exhausted bool `json:"exhausted,omitempty"`
	// Why is the error that sent it to the spool (or, under dead/, why the
	// coordinator refused it).
	Why string `json:"why,omitempty"`

	file string // the spool file it was read from ("" for a new report)
}

// PatchReport builds a report for a PATCH.
func PatchReport(jobID string, p PatchRequest) Report {
	return Report{V: 1, Kind: KindPatch, JobID: jobID, LeaseEpoch: p.LeaseEpoch, Patch: &p}
}

// FailReport builds a report for /fleet/fail.
func FailReport(f FailRequest) Report {
	return Report{V: 1, Kind: KindFail, JobID: f.JobID, LeaseEpoch: f.LeaseEpoch, Fail: &f}
}

// Final reports whether the report ends this factory's run of the job.
func (r Report) Final() bool { return r.Kind == KindFail || (r.Patch != nil && r.Patch.Terminal()) }

// ArtifactReport builds an upload for the artifact spool.
func ArtifactReport(jobID string, a ArtifactUpload) Report {
	return Report{V: 1, Kind: KindArtifact, JobID: jobID, LeaseEpoch: a.LeaseEpoch, Artifact: &a}
}

func (r Report) stage() string {
	if r.Patch != nil {
		return r.Patch.Stage
	}
	if r.Artifact != nil {
		return "artifact:" + r.Artifact.Name
	}
	return "fail:" + string(r.Fail.Reason)
}

// Spool is $AQ_HOME/spool: reports the coordinator could not take yet, one
// JSON file per report named <seq>-<key>.json (seq zero-padded to 20
// digits, so names sort in order; key is the job id, or for a value that is
// not a valid job id — a report about a job refused at admission — "x-" and
// a hash of it: a name never climbs out of the spool), each written to a
// temp file, fsynced and renamed. A file whose name does not match its
// content is corrupt (moved to dead/, never re-sent). Reports the coordinator refused for good (a 4xx other than 409)
// move to spool/dead/ with the reason: no report is ever deleted unread.
// Safe for concurrent use, and between aq processes on one host (a flock on
// spool/.lock guards sequence numbers).
type Spool struct {
	dir string
	mu  sync.Mutex
	fl  *flock.Flock
}

// OpenSpool opens (creating) the spool at dir.
func OpenSpool(dir string) (*Spool, error) {
	if err := os.MkdirAll(filepath.Join(dir, "dead"), 0o700); err != nil {
		return nil, fmt.Errorf("create the report spool: %w", err)
	}
	return &Spool{dir: dir, fl: flock.New(filepath.Join(dir, ".lock"))}, nil
}

// Dir is the spool's directory.
func (s *Spool) Dir() string { return s.dir }

var spoolName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^([0-9]{20})-([A-Za-z0-9][A-Za-z0-9._-]{0,127})\.json$`)
})

// Append stores r with the next sequence number and returns it as stored.
func (s *Spool) Append(r Report) (Report, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fl.Lock(); err != nil {
		return r, fmt.Errorf("lock the report spool: %w", err)
	}
	defer s.fl.Unlock()
	seq, err := s.maxSeq()
	if err != nil {
		return r, err
	}
	r.V, r.Seq = 1, seq+1
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now().UTC()
	}
	if err := atomicfile.WriteJSON(s.path(r), r, 0o600); err != nil {
		return r, fmt.Errorf("write to the report spool: %w", err)
	}
	return r, nil
}

func (s *Spool) maxSeq() (int64, error) {
	var max int64
	for _, d := range []string{s.dir, filepath.Join(s.dir, "dead")} {
		ents, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
		for _, e := range ents {
			if m := spoolName().FindStringSubmatch(e.Name()); m != nil {
				if n, _ := strconv.ParseInt(m[1], 10, 64); n > max {
					max = n
				}
			}
		}
	}
	return max, nil
}

// Pending returns the spooled reports in sequence order. A file that cannot
// be read or parsed is moved to dead/ and reported in errs.
func (s *Spool) Pending() (reports []Report, errs []error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []error{err}
	}
	for _, e := range ents {
		if e.IsDir() || !spoolName().MatchString(e.Name()) {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // delivered meanwhile
		}
		var r Report
		if err == nil {
			r, err = readReport(e.Name(), b)
		}
		if err != nil {
			_ = os.Rename(p, filepath.Join(s.dir, "dead", e.Name()))
			errs = append(errs, fmt.Errorf("spool file %s is corrupt (moved to dead/): %v", e.Name(), err))
			continue
		}
		reports = append(reports, r)
	}
	sort.Slice(reports, func(i, j int) bool { return reports[i].Seq < reports[j].Seq })
	return reports, errs
}

// Depth is how many reports wait.
func (s *Spool) Depth() int {
	rs, _ := s.Pending()
	return len(rs)
}

// Has reports whether a report for jobID waits.
func (s *Spool) Has(jobID string) bool {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return false
	}
	key := spoolKey(jobID)
	for _, e := range ents {
		if m := spoolName().FindStringSubmatch(e.Name()); m != nil && m[2] == key {
			return true
		}
	}
	return false
}

// Remove deletes a delivered (or fenced) report.
func (s *Spool) Remove(r Report) error {
	err := os.Remove(s.path(r))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		atomicfile.SyncDir(s.dir)
	}
	return err
}

// Reject moves r to dead/ with why: the coordinator refused it for good.
func (s *Spool) Reject(r Report, why string) error {
	r.Why = why
	if r.Seq == 0 { // never spooled: give it a number
		var err error
		if r, err = s.Append(r); err != nil {
			return err
		}
	}
	if err := atomicfile.WriteJSON(filepath.Join(s.dir, "dead", fileName(r)), r, 0o600); err != nil {
		return err
	}
	return s.Remove(r)
}

// Dead returns the refused reports.
func (s *Spool) Dead() []string {
	ents, _ := os.ReadDir(filepath.Join(s.dir, "dead"))
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}

func (s *Spool) path(r Report) string { return filepath.Join(s.dir, fileName(r)) }

// fileName is r's file name in the spool (and in dead/): the one it was
// read from, else <seq>-<key>.json.
func fileName(r Report) string {
	if r.file != "" {
		return r.file
	}
	return fmt.Sprintf("%020d-%s.json", r.Seq, spoolKey(r.JobID))
}

// spoolKey is the part of a spool file's name that names its job: the id
// itself when it is a valid job id, else "x-" and 32 hex digits of its
// SHA-256 — safe as a file name, and stable, so the file is found again.
// The content's jobId is what a report is sent for.
func spoolKey(jobID string) string {
	if job.ValidID(jobID) {
		return jobID
	}
	sum := sha256.Sum256([]byte(jobID))
	return "x-" + hex.EncodeToString(sum[:16])
}

// readReport reads the spool file called name whose content is data: a
// report, or why it is not one (checkReport). It is the spool's reader;
// Pending moves what it refuses to dead/.
func readReport(name string, data []byte) (Report, error) {
	m := spoolName().FindStringSubmatch(name)
	if m == nil {
		return Report{}, errors.New("not a spool file's name")
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return Report{}, err
	}
	if err := checkReport(r, m[2]); err != nil {
		return Report{}, err
	}
	r.Seq, _ = strconv.ParseInt(m[1], 10, 64)
	r.file = name
	return r, nil
}

// checkReport says what is wrong with r, read from a spool file whose
// name's key is key: a report of a kind aq does not know, without its
// body, or whose job is not the one its name says (a file renamed or
// written by hand: re-sending it would never remove it).
func checkReport(r Report, key string) error {
	switch {
	case r.Kind == KindPatch && r.Patch == nil || r.Kind == KindFail && r.Fail == nil || r.Kind == KindArtifact && r.Artifact == nil ||
		r.Kind != KindPatch && r.Kind != KindFail && r.Kind != KindArtifact:
		return errors.New("not a report")
	case r.JobID == "":
		return errors.New("the report names no job")
	case spoolKey(r.JobID) != key:
		return fmt.Errorf("the file's name says job %s, its content job %s", key, job.Show(r.JobID))
	case r.Fail != nil && r.Fail.JobID != r.JobID:
		return fmt.Errorf("the report is for job %s, its fail for job %s", job.Show(r.JobID), job.Show(r.Fail.JobID))
	}
	return nil
}
