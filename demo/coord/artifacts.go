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
	"slices"
	"strconv"
	"sync"
	"time"
)

// Artifacts, the pointer-plus-bytes model of docs/contract.md, "Artifacts":
// a pointer document per artifact (what GET /fleet/jobs/:id/artifacts
// lists) and its bytes beside it (GET /fleet/artifacts/:id). The stub keeps
// both in memory only — never in its state file — bounded per job.

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
	seq   int64
	byJob map[string][]Artifact
	bytes map[string][]byte // id → gzip bytes
}

func (a *artifactStore) init() {
	if a.byJob == nil {
		a.byJob, a.bytes = map[string][]Artifact{}, map[string][]byte{}
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
	gz, ok := s.arts.bytes[id]
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
	l := append(s.arts.byJob[id], a)
	if len(l) > maxArtifactsPerJob {
		for _, old := range l[:len(l)-maxArtifactsPerJob] {
			delete(s.arts.bytes, old.ID)
		}
		l = slices.Clone(l[len(l)-maxArtifactsPerJob:])
	}
	s.arts.byJob[id] = l
	s.arts.bytes[a.ID] = gz
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
	gz, ok := s.arts.bytes[id]
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
	_, ok := s.arts.bytes[id]
	if ok {
		delete(s.arts.bytes, id)
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
