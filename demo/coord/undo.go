package coord

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Undoing an operator's mistake (docs/contract.md, "Submitting jobs and
// operator actions"): PUT /fleet/jobs/:id gives a job that is not running a new manifest,
// keeping its history; DELETE /fleet/jobs/:id removes one. A job that runs
// (assigned, building) is refused 409 with the factory that holds it; one
// whose work is done (review, testing, shipped) cannot be replaced (409). A
// job the stub does not have is 404 with a JSON body.

// replaceable are the stages PUT /fleet/jobs/:id accepts.
var replaceable = []string{StageQueued, StageBlocked, StageFailed, StageDeadLetter}

// handleReplace is PUT /fleet/jobs/:id {manifest, bodyMd, idempotencyKey?}:
// the job takes the new manifest and goes back to queued (or blocked until
// its new deps ship), its epoch bumped (a stale holder is fenced), its
// attempts, spend, events and — for the same repository — checkpoint kept.
// Answer: {jobId, stage, replaced: the stage it was in}.
func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request, _ who) {
	var req submitReq
	if !decode(w, r, &req) {
		return
	}
	id, m := r.PathValue("id"), req.Manifest
	switch {
	case m == nil:
		writeErr(w, http.StatusBadRequest, "manifest is required")
		return
	case strings.TrimSpace(req.BodyMd) == "":
		writeErr(w, http.StatusBadRequest, "bodyMd (the verbatim manifest) is required")
		return
	case m.ID != id:
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("manifest.id %q is not the job %q the path names", m.ID, id))
		return
	case m.Repo == "":
		writeErr(w, http.StatusBadRequest, "manifest.repo is required")
		return
	}
	key := req.IdempotencyKey
	if key == "" {
		key = m.IdempotencyKey
	}
	if key != "" {
		for _, o := range s.st.jobs() {
			if o.ID != id && o.IdempotencyKey == key {
				writeErr(w, http.StatusConflict, fmt.Sprintf("idempotencyKey %q is job %s's; a replaced job may keep its own key or take a new one", key, o.ID))
				return
			}
		}
	}
	snap, _ := json.Marshal(m)
	stageOf := func(d string) (string, bool) {
		o, ok := s.st.job(d)
		return o.Stage, ok
	}
	var was string
	j, code, msg := s.mutate(id, func(j *Job, now time.Time) (int, string, []Event) {
		was = j.Stage
		if code, msg := refuseRunning(j, "replaced"); code != 0 {
			return code, msg, nil
		}
		if !slices.Contains(replaceable, j.Stage) {
			return http.StatusConflict, fmt.Sprintf("job %s is %s: its work is done, so it is not replaced (ship or reject it, or submit the new manifest under another id)", j.ID, j.Stage), nil
		}
		if j.Repo != m.Repo {
			j.Checkpoint = "" // a checkpoint of another repository
		}
		j.Repo, j.RepoURL, j.Base, j.Engine, j.Priority = m.Repo, m.RepoURL, m.Base, m.Engine, m.Priority
		j.Capabilities, j.Deps, j.DepsMode, j.Retry = append([]string{}, m.Capabilities...), m.Deps, m.DepsMode, m.Retry
		j.BodyMd, j.ManifestSnapshot, j.IdempotencyKey = req.BodyMd, snap, key
		if m.Product != "" {
			j.ProductID = m.Product
		}
		j.LeaseEpoch++
		j.Holder, j.LeaseExpiresAt, j.NotBefore, j.Waiting, j.Last = "", time.Time{}, time.Time{}, false, nil
		j.Reason, j.Detail = "", "replaced by an operator"
		j.Stage = StageQueued
		if !depsShipped(j, stageOf) {
			j.Stage = StageBlocked
		}
		return 0, "", []Event{{JobID: j.ID, Kind: "replaced", Epoch: j.LeaseEpoch, Stage: j.Stage, Detail: "a new manifest; it was " + was}}
	})
	if code != 0 {
		writeErr(w, code, msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobId": j.ID, "stage": j.Stage, "replaced": was})
}

// handleRemove is DELETE /fleet/jobs/:id: the job, its events and its
// artifacts are deleted, unless it runs. Answer: {jobId, stage: the stage
// it was in, dependents: the jobs not shipped that depend on it}.
func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request, _ who) {
	id := r.PathValue("id")
	for range 50 {
		j, ok := s.st.job(id)
		if !ok {
			writeErr(w, http.StatusNotFound, "no job "+id)
			return
		}
		if code, msg := refuseRunning(&j, "removed"); code != 0 {
			writeErr(w, code, msg)
			return
		}
		err := s.st.remove(j)
		if errors.Is(err, errConflict) {
			continue // it moved meanwhile: look again
		}
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err.Error())
			return
		}
		s.arts.mu.Lock()
		s.arts.init()
		for _, a := range s.arts.byJob[id] {
			s.arts.drop(a.ID) // on disk too: a restarted stub must not bring them back
		}
		delete(s.arts.byJob, id)
		s.arts.mu.Unlock()
		s.logs.remove(id)
		dependents := []string{}
		for _, o := range s.st.jobs() {
			if o.Stage != StageShipped && slices.Contains(o.Deps, id) {
				dependents = append(dependents, o.ID)
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"jobId": id, "stage": j.Stage, "dependents": dependents})
		return
	}
	writeErr(w, http.StatusServiceUnavailable, "too much contention on job "+id)
}

// refuseRunning is 409 for a job a factory holds.
func refuseRunning(j *Job, what string) (int, string) {
	if !j.held() {
		return 0, ""
	}
	return http.StatusConflict, fmt.Sprintf("job %s is running (%s on factory %s, epoch %d): it is not %s while it runs (wait for it to end, or requeue or reject it first)",
		j.ID, j.Stage, orNone(j.Holder), j.LeaseEpoch, what)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
