package coord

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
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
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
)

// Artifacts, the pointer-plus-bytes model of docs/contract.md, "Artifacts":
// a pointer document per artifact (what GET /fleet/jobs/:id/artifacts
// lists) and its bytes beside it (GET /fleet/artifacts/:id), bounded per
// job. Without a state file the stub keeps them in memory; with one, on
// disk beside it (LogDir: <id>.gz, then <id>.json, each written atomically
// and fsynced before the answer), so a restarted stub still has them.

// Artifact is one artifact's pointer document. Field names are the wire
// format (docs/contract.md, "Artifacts").
type Artifact struct {
	ID          string `json:"id"`
	JobID       string `json:"jobId"`
	Name        string `json:"name"`
	Kind        string `json:"kind"` // log | transcript
	ContentType string `json:"contentType"`
	// Encoding is how the bytes are stored and served: gzip.
	Encoding string `json:"encoding"`
	// Size is the content's length (after masking and truncation), before
	// gzip; OriginalSize the log's length before truncation; StoredSize
	// the gzip bytes.
	Size         int64     `json:"size"`
	OriginalSize int64     `json:"originalSize"`
	StoredSize   int64     `json:"storedSize"`
	Truncated    bool      `json:"truncated"`
	SHA256       string    `json:"sha256"` // of the content (uncompressed)
	Attempt      int       `json:"attempt,omitempty"`
	LeaseEpoch   int64     `json:"leaseEpoch"`
	FactoryID    string    `json:"factoryId,omitempty"`
	CreatedAt    time.Time `json:"createdAt"`
	URL          string    `json:"url"` // the bytes: /fleet/artifacts/<id>
}

// ArtifactUpload is the body of POST /fleet/jobs/:id/artifacts: the
// pointer's fields and the gzip bytes, base64-encoded.
type ArtifactUpload struct {
	Name         string `json:"name"`
	Kind         string `json:"kind"`
	ContentType  string `json:"contentType"`
	Encoding     string `json:"encoding"`
	Size         int64  `json:"size"`
	OriginalSize int64  `json:"originalSize"`
	Truncated    bool   `json:"truncated"`
	SHA256       string `json:"sha256"`
	Attempt      int    `json:"attempt"`
	LeaseEpoch   int64  `json:"leaseEpoch"`
	FactoryID    string `json:"factoryId"`
	Data         string `json:"data"` // base64 (standard) of the gzip bytes
}

// Routes of the artifacts.
const (
	RouteArtifactUpload = "POST /fleet/jobs/{id}/artifacts"
	RouteArtifactList   = "GET /fleet/jobs/{id}/artifacts"
	RouteArtifactGet    = "GET /fleet/artifacts/{id}"
	RouteArtifactDelete = "DELETE /fleet/artifacts/{id}"
)

// Limits of the stub's artifact store.
const (
	// MaxArtifactBody bounds an upload's request body (base64 of the gzip
	// bytes, plus the pointer).
	MaxArtifactBody = 24 << 20
	// maxArtifactsPerJob: older artifacts of a job are dropped beyond it.
	maxArtifactsPerJob = 64
)

type artifactStore struct {
	mu    sync.Mutex
	dir   string // "": memory only
	seq   int64
	byJob map[string][]Artifact
	bytes map[string][]byte // memory only: id → gzip bytes
}

func (a *artifactStore) init() {
	if a.byJob == nil {
		a.byJob, a.bytes = map[string][]Artifact{}, map[string][]byte{}
	}
}

// open keeps the artifacts in dir ("": memory) and loads those kept there;
// a pointer whose bytes are missing (a crash between the two writes, never
// answered) is dropped.
func (a *artifactStore) open(dir string) error {
	a.init()
	if dir == "" {
		return nil
	}
	a.dir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("artifact store %s: %w", dir, err)
	}
	ptrs, err := filepath.Glob(filepath.Join(dir, "art-*.json"))
	if err != nil {
		return err
	}
	var all []Artifact
	for _, p := range ptrs {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var x Artifact
		if json.Unmarshal(b, &x) != nil || !validID(x.ID) || !validID(x.JobID) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, x.ID+".gz")); err != nil {
			_ = os.Remove(p)
			continue
		}
		all = append(all, x)
		a.seq = max(a.seq, artifactSeq(x.ID))
	}
	sort.Slice(all, func(i, j int) bool { return artifactSeq(all[i].ID) < artifactSeq(all[j].ID) })
	for _, x := range all {
		a.byJob[x.JobID] = append(a.byJob[x.JobID], x)
	}
	return nil
}

func artifactSeq(id string) int64 {
	n, _ := strconv.ParseInt(strings.TrimPrefix(id, "art-"), 10, 64)
	return n
}

// gz returns an artifact's stored gzip bytes.
func (a *artifactStore) gz(id string) ([]byte, bool) {
	if a.dir == "" {
		b, ok := a.bytes[id]
		return b, ok
	}
	if !validID(id) {
		return nil, false
	}
	b, err := os.ReadFile(filepath.Join(a.dir, id+".gz"))
	return b, err == nil
}

// keep stores x's bytes, then its pointer.
func (a *artifactStore) keep(x Artifact, gz []byte) error {
	if a.dir == "" {
		a.bytes[x.ID] = gz
		return nil
	}
	if err := atomicfile.WriteFile(filepath.Join(a.dir, x.ID+".gz"), gz, 0o600); err != nil {
		return err
	}
	b, err := json.Marshal(x)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(a.dir, x.ID+".json"), b, 0o600)
}

// drop forgets an artifact's bytes and pointer.
func (a *artifactStore) drop(id string) {
	delete(a.bytes, id)
	if a.dir != "" && validID(id) {
		_ = os.Remove(filepath.Join(a.dir, id+".json"))
		_ = os.Remove(filepath.Join(a.dir, id+".gz"))
	}
}

// Artifacts lists job id's artifacts, oldest first.
func (s *Server) Artifacts(id string) []Artifact {
	s.arts.mu.Lock()
	defer s.arts.mu.Unlock()
	return slices.Clone(s.arts.byJob[id])
}

// ArtifactContent returns an artifact's content, gunzipped.
func (s *Server) ArtifactContent(id string) ([]byte, bool) {
	s.arts.mu.Lock()
	gz, ok := s.arts.gz(id)
	s.arts.mu.Unlock()
	if !ok {
		return nil, false
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, false
	}
	b, err := io.ReadAll(zr)
	return b, err == nil
}

// handleArtifactUpload stores an artifact of a job: the body is checked
// (base64, gzip, size and sha256 as declared), and an upload identical to
// one stored (same name, epoch and sha256: a retry whose answer was lost)
// answers the stored pointer with 200 instead of storing it twice.
func (s *Server) handleArtifactUpload(w http.ResponseWriter, r *http.Request, c who) {
	id := r.PathValue("id")
	if _, ok := s.st.job(id); !ok {
		writeErr(w, http.StatusNotFound, "no job "+id)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxArtifactBody+1))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "cannot read the body")
		return
	}
	if len(body) > MaxArtifactBody {
		writeErr(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("an artifact upload is at most %d bytes", MaxArtifactBody))
		return
	}
	var up ArtifactUpload
	if err := json.Unmarshal(body, &up); err != nil {
		writeErr(w, http.StatusBadRequest, "the body is not valid JSON: "+err.Error())
		return
	}
	gz, err := base64.StdEncoding.DecodeString(up.Data)
	switch {
	case !validID(up.Name):
		writeErr(w, http.StatusBadRequest, "name is missing or not a valid name")
		return
	case up.Encoding != "gzip":
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("encoding %q: only gzip is taken", up.Encoding))
		return
	case err != nil:
		writeErr(w, http.StatusBadRequest, "data is not base64: "+err.Error())
		return
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	var content []byte
	if err == nil {
		content, err = io.ReadAll(zr)
	}
	if err != nil {
		writeErr(w, http.StatusBadRequest, "data is not gzip: "+err.Error())
		return
	}
	sum := sha256.Sum256(content)
	switch {
	case int64(len(content)) != up.Size:
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("size %d declared, %d received", up.Size, len(content)))
		return
	case up.SHA256 != "" && up.SHA256 != hex.EncodeToString(sum[:]):
		writeErr(w, http.StatusBadRequest, "sha256 does not match the content")
		return
	}
	ctype := up.ContentType
	if ctype == "" {
		ctype = "text/plain; charset=utf-8"
	}
	factory := c.factory
	if factory == "" {
		factory = up.FactoryID
	}
	s.arts.mu.Lock()
	s.arts.init()
	for _, a := range s.arts.byJob[id] {
		if a.Name == up.Name && a.LeaseEpoch == up.LeaseEpoch && a.SHA256 == hex.EncodeToString(sum[:]) {
			s.arts.mu.Unlock()
			writeJSON(w, http.StatusOK, a)
			return
		}
	}
	s.arts.seq++
	a := Artifact{
		ID: "art-" + strconv.FormatInt(s.arts.seq, 10), JobID: id, Name: up.Name, Kind: up.Kind, ContentType: ctype,
		Encoding: "gzip", Size: int64(len(content)), OriginalSize: max(up.OriginalSize, int64(len(content))), StoredSize: int64(len(gz)),
		Truncated: up.Truncated, SHA256: hex.EncodeToString(sum[:]), Attempt: up.Attempt, LeaseEpoch: up.LeaseEpoch,
		FactoryID: factory, CreatedAt: s.o.Now().UTC(),
	}
	a.URL = "/fleet/artifacts/" + a.ID
	if err := s.arts.keep(a, gz); err != nil {
		s.arts.drop(a.ID)
		s.arts.mu.Unlock()
		writeErr(w, http.StatusInternalServerError, "cannot keep the artifact: "+err.Error())
		return
	}
	l := append(s.arts.byJob[id], a)
	if len(l) > maxArtifactsPerJob {
		for _, old := range l[:len(l)-maxArtifactsPerJob] {
			s.arts.drop(old.ID)
		}
		l = slices.Clone(l[len(l)-maxArtifactsPerJob:])
	}
	s.arts.byJob[id] = l
	s.arts.mu.Unlock()
	writeJSON(w, http.StatusCreated, a)
}

func (s *Server) handleArtifactList(w http.ResponseWriter, r *http.Request, _ who) {
	id := r.PathValue("id")
	if _, ok := s.st.job(id); !ok {
		writeErr(w, http.StatusNotFound, "no job "+id)
		return
	}
	l := s.Artifacts(id)
	if l == nil {
		l = []Artifact{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"artifacts": l})
}

// handleArtifactGet serves the stored gzip bytes with Content-Encoding
// gzip and the artifact's own content type.
func (s *Server) handleArtifactGet(w http.ResponseWriter, r *http.Request, _ who) {
	id := r.PathValue("id")
	s.arts.mu.Lock()
	gz, ok := s.arts.gz(id)
	var a Artifact
	if ok {
		for _, l := range s.arts.byJob {
			for _, x := range l {
				if x.ID == id {
					a = x
				}
			}
		}
	}
	s.arts.mu.Unlock()
	if !ok {
		writeErr(w, http.StatusNotFound, "no artifact "+id)
		return
	}
	w.Header().Set("Content-Type", a.ContentType)
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Set("Content-Length", strconv.Itoa(len(gz)))
	w.Header().Set("X-Artifact-Sha256", a.SHA256)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(gz)
}

func (s *Server) handleArtifactDelete(w http.ResponseWriter, r *http.Request, _ who) {
	id := r.PathValue("id")
	s.arts.mu.Lock()
	ok := false
	for _, l := range s.arts.byJob {
		for _, x := range l {
			ok = ok || x.ID == id
		}
	}
	if ok {
		s.arts.drop(id)
		for j, l := range s.arts.byJob {
			s.arts.byJob[j] = slices.DeleteFunc(l, func(a Artifact) bool { return a.ID == id })
		}
	}
	s.arts.mu.Unlock()
	if !ok {
		writeErr(w, http.StatusNotFound, "no artifact "+id)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"deleted": true})
}
