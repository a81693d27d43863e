package coord

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/job"
)

var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

func validID(id string) bool { return idPattern().MatchString(id) && !strings.Contains(id, "..") }

// ---- factories ----

type enrollReq struct {
	FactoryID    string   `json:"factoryId"`
	Hostname     string   `json:"hostname"`
	Capabilities []string `json:"capabilities"`
	Repos        []string `json:"repos"`
	Engines      []string `json:"engines"`
	SeatLimit    int      `json:"seatLimit"`
	Version      string   `json:"version"`
	Pool         string   `json:"pool"`
}

// handleEnroll trades the enrollment token for a factory token. Enrolling
// an id again rotates its token (the old one stops working).
func (s *Server) handleEnroll(w http.ResponseWriter, r *http.Request) {
	if t := bearer(r); t == "" || subtle.ConstantTimeCompare([]byte(t), []byte(s.enrol)) != 1 {
		writeErr(w, http.StatusUnauthorized, "enroll needs the enrollment token")
		return
	}
	var req enrollReq
	if !decode(w, r, &req) {
		return
	}
	if !validID(req.FactoryID) {
		writeErr(w, http.StatusBadRequest, "factoryId is missing or not a valid id")
		return
	}
	tok := newToken("aqf_")
	now := s.o.Now().UTC()
	if _, _, err := s.st.updateFactory(req.FactoryID, true, func(f *Factory) {
		f.TokenHash, f.Revoked = hashToken(tok), false
		f.Hostname, f.Capabilities, f.Repos, f.Engines = req.Hostname, req.Capabilities, req.Repos, req.Engines
		f.SeatLimit, f.Version, f.EnrolledAt, f.Pool = req.SeatLimit, req.Version, now, req.Pool
	}); err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"factoryId": req.FactoryID, "token": tok})
}

type heartbeatReq struct {
	FactoryID    string       `json:"factoryId"`
	Capabilities []string     `json:"capabilities"`
	Repos        []string     `json:"repos"`
	Load         float64      `json:"load"`
	SeatLimit    int          `json:"seatLimit"`
	Health       string       `json:"health"`
	Running      []RunningJob `json:"running"`
	Version      string       `json:"version"`
	Pool         string       `json:"pool"`
}

func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request, c who) {
	var req heartbeatReq
	if !decode(w, r, &req) || !sameFactory(w, c, req.FactoryID) {
		return
	}
	now := s.o.Now().UTC()
	_, ok, err := s.st.updateFactory(c.factory, false, func(f *Factory) {
		f.Capabilities, f.Repos, f.Load, f.SeatLimit = req.Capabilities, req.Repos, req.Load, req.SeatLimit
		f.Health, f.Running, f.Version, f.LastHeartbeatAt = req.Health, req.Running, req.Version, now
		f.Deregistered, f.Pool = req.Health == "offline" && f.Deregistered, req.Pool
	})
	switch {
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	case !ok:
		writeErr(w, http.StatusUnauthorized, "unknown factory")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "staleAfterSec": int(s.o.StaleAfter / time.Second)})
	}
}

func (s *Server) handleFactories(w http.ResponseWriter, r *http.Request, _ who) {
	writeJSON(w, http.StatusOK, map[string]any{"factories": s.Factories()})
}

// handleDeregister: a factory leaving cleanly (a replica that exits) is no
// longer listed or targeted, so short-lived replicas do not pile up stale
// records; its token stays valid and a later heartbeat registers it again.
func (s *Server) handleDeregister(w http.ResponseWriter, r *http.Request, c who) {
	if id := r.PathValue("id"); id != c.factory {
		writeErr(w, http.StatusForbidden, fmt.Sprintf("factory %q may deregister only itself, not %q", c.factory, id))
		return
	}
	_, ok, err := s.st.updateFactory(c.factory, false, func(f *Factory) {
		f.Deregistered, f.Health, f.Running, f.Load = true, "offline", nil, 0
	})
	switch {
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	case !ok:
		writeErr(w, http.StatusNotFound, "unknown factory")
	default:
		writeJSON(w, http.StatusOK, map[string]bool{"deregistered": true})
	}
}

func (s *Server) handleRevoke(w http.ResponseWriter, r *http.Request, c who) {
	id := r.PathValue("id")
	if c.factory != "" && c.factory != id {
		writeErr(w, http.StatusForbidden, "a factory may revoke only its own token")
		return
	}
	if err := s.RevokeFactory(id); err != nil {
		writeErr(w, http.StatusNotFound, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"revoked": true})
}

// RevokeFactory revokes factory id's token: its next call gets 401.
func (s *Server) RevokeFactory(id string) error {
	_, ok, err := s.st.updateFactory(id, false, func(f *Factory) { f.Revoked = true })
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no factory %s", id)
	}
	return nil
}

// ---- queue state, claim, accept ----

func (s *Server) handleQueueState(w http.ResponseWriter, r *http.Request, _ who) {
	// One version for the whole queue: claims are not scoped by product
	// (product is a tag, not the routing key), so neither is the gate.
	v := s.st.version()
	if s.broken(BreakFrozenVersion) {
		v = 1
	}
	writeJSON(w, http.StatusOK, map[string]any{"productId": r.Header.Get("x-product-id"), "version": v})
}

type claimReq struct {
	FactoryID    string   `json:"factoryId"`
	Capabilities []string `json:"capabilities"`
	Repos        []string `json:"repos"`
	DryRun       bool     `json:"dryRun"`
}

type claimAnswer struct {
	Job            Job       `json:"job"`
	LeaseEpoch     int64     `json:"leaseEpoch"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt,omitzero"`
}

// claimed is the answer to a claim or an accept of j: the job document
// with its previous attempt — which the legacy route set leaves out, as
// today's coordinator does not have it.
func (s *Server) claimed(j Job, epoch int64, expires time.Time) claimAnswer {
	if s.legacy() {
		j.Previous = nil
	}
	return claimAnswer{Job: j, LeaseEpoch: epoch, LeaseExpiresAt: expires}
}

// handleClaim picks the best job for the factory and takes its lease with a
// CAS on the job's revision; a lost CAS (another claim won) picks again.
func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request, c who) {
	var req claimReq
	if !decode(w, r, &req) || !sameFactory(w, c, req.FactoryID) {
		return
	}
	offer := Offer{Capabilities: req.Capabilities, Repos: req.Repos}
	for range 50 {
		j, ok := Pick(s.st.jobs(), offer, s.o.Now())
		if !ok {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if req.DryRun {
			writeJSON(w, http.StatusOK, s.claimed(j, j.LeaseEpoch+1, time.Time{}))
			return
		}
		now := s.o.Now().UTC()
		s.lease(&j, c.factory, now)
		nj, err := s.st.cas(j, now, Event{JobID: j.ID, Kind: "claimed", Factory: c.factory, Epoch: j.LeaseEpoch, Stage: j.Stage})
		if err == errConflict {
			continue
		}
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err.Error())
			return
		}
		s.call(Call{Route: RouteClaim, JobID: nj.ID, Factory: c.factory, Epoch: nj.LeaseEpoch, JobEpoch: nj.LeaseEpoch, Stage: nj.Stage, Attempts: nj.Attempts, Status: http.StatusOK})
		writeJSON(w, http.StatusOK, s.claimed(nj, nj.LeaseEpoch, nj.LeaseExpiresAt))
		return
	}
	writeErr(w, http.StatusServiceUnavailable, "too much contention; try again")
}

// lease makes j assigned to factory under a new epoch.
func (s *Server) lease(j *Job, factory string, now time.Time) {
	j.LeaseEpoch++
	j.Attempts++
	j.Stage, j.Holder = StageAssigned, factory
	j.LeaseExpiresAt = now.Add(s.o.LeaseTTL)
	j.Reason, j.Detail, j.NotBefore, j.Waiting, j.Last = "", "", time.Time{}, false, nil
}

type acceptReq struct {
	JobID     string `json:"jobId"`
	FactoryID string `json:"factoryId"`
}

// handleAccept takes the lease on one named job (a broker delivery): 409
// unless it is queued and due, 404 when there is no such job.
func (s *Server) handleAccept(w http.ResponseWriter, r *http.Request, c who) {
	var req acceptReq
	if !decode(w, r, &req) || !sameFactory(w, c, req.FactoryID) {
		return
	}
	j, ok := s.leaseCall(w, Call{Route: RouteAccept, Factory: c.factory}, req.JobID, func(j *Job, now time.Time) (int, string, []Event) {
		if !Runnable(j, now) && !(s.broken(BreakDoubleLease) && j.held()) {
			return http.StatusConflict, fmt.Sprintf("job %s is %s, not queued and due", j.ID, j.Stage), nil
		}
		s.lease(j, c.factory, now)
		return 0, "", []Event{{JobID: j.ID, Kind: "accepted", Factory: c.factory, Epoch: j.LeaseEpoch, Stage: j.Stage}}
	})
	if ok {
		writeJSON(w, http.StatusOK, s.claimed(j, j.LeaseEpoch, j.LeaseExpiresAt))
	}
}

// leaseCall runs a lease call (accept, renew, release, PATCH, fail) on job
// id through mutate, hands its audit record to Options.OnCall and answers a
// refusal: 409 (fenced), or the error mutate gave. It returns the job and
// true when the caller is to answer 200: fn's change was stored, or fn
// answered 200 for a re-send of the last accepted report (rc.Resend). rc
// carries what the call sent (route, factory, epoch, reason; a PATCH's
// stage); the rest is filled in from the job.
func (s *Server) leaseCall(w http.ResponseWriter, rc Call, id string, fn func(j *Job, now time.Time) (int, string, []Event)) (Job, bool) {
	j, code, msg := s.mutate(id, func(j *Job, now time.Time) (int, string, []Event) {
		rc.Holder = j.Holder // before the change
		return fn(j, now)
	})
	rc.JobID, rc.JobEpoch, rc.Attempts = id, j.LeaseEpoch, j.Attempts
	if rc.Stage == "" {
		rc.Stage = j.Stage
	}
	switch code {
	case 0, http.StatusOK:
		if rc.Route == RouteAccept {
			rc.Epoch = j.LeaseEpoch // an accept carries no epoch: the one it was granted
		}
		rc.Status, rc.Resend = http.StatusOK, code == http.StatusOK
		s.call(rc)
		return j, true
	case http.StatusConflict:
		rc.Status = http.StatusConflict
		s.call(rc)
		s.fenced(w, j, rc.Route, rc.Factory, rc.Epoch, msg)
	default:
		writeErr(w, code, msg)
	}
	return j, false
}

// ---- lease ----

type leaseReq struct {
	FactoryID  string `json:"factoryId"`
	LeaseEpoch int64  `json:"leaseEpoch"`
}

// epoch is the lease epoch a write carries, as the stub judges it: the
// job's own under BreakStaleEpoch (a stale epoch is taken as current).
func (s *Server) epoch(j *Job, sent int64) int64 {
	if s.broken(BreakStaleEpoch) {
		return j.LeaseEpoch
	}
	return sent
}

// holds reports why factory at epoch does not hold j ("" when it does).
func holds(j *Job, factory string, epoch int64) string {
	switch {
	case !j.held():
		return fmt.Sprintf("job %s is %s: nobody holds its lease", j.ID, j.Stage)
	case j.LeaseEpoch != epoch:
		return fmt.Sprintf("stale lease epoch %d (current %d)", epoch, j.LeaseEpoch)
	case j.Holder != factory:
		return fmt.Sprintf("the lease is held by %s", j.Holder)
	}
	return ""
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request, c who) {
	var req leaseReq
	if !decode(w, r, &req) || !sameFactory(w, c, req.FactoryID) {
		return
	}
	j, ok := s.leaseCall(w, Call{Route: RouteRenew, Factory: c.factory, Epoch: req.LeaseEpoch}, r.PathValue("id"), func(j *Job, now time.Time) (int, string, []Event) {
		if why := holds(j, c.factory, s.epoch(j, req.LeaseEpoch)); why != "" {
			return http.StatusConflict, why, nil
		}
		if now.After(j.LeaseExpiresAt) {
			return http.StatusConflict, "the lease expired", nil
		}
		j.LeaseExpiresAt = now.Add(s.o.LeaseTTL)
		return 0, "", nil
	})
	if ok {
		writeJSON(w, http.StatusOK, map[string]any{"leaseExpiresAt": j.LeaseExpiresAt})
	}
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, c who) {
	var req leaseReq
	if !decode(w, r, &req) || !sameFactory(w, c, req.FactoryID) {
		return
	}
	j, ok := s.leaseCall(w, Call{Route: RouteRelease, Factory: c.factory, Epoch: req.LeaseEpoch}, r.PathValue("id"), func(j *Job, now time.Time) (int, string, []Event) {
		if l := j.Last; l != nil && l.Kind == "release" && l.Factory == c.factory && l.Epoch == req.LeaseEpoch && j.LeaseEpoch == req.LeaseEpoch {
			return http.StatusOK, "", nil // already released
		}
		if l := j.Last; l != nil && l.Kind == "patch" && (l.Stage == StageFailed || l.Stage == StageQueued) && l.Factory == c.factory &&
			l.Epoch == req.LeaseEpoch && j.LeaseEpoch == req.LeaseEpoch && j.Holder == "" && !j.held() {
			return http.StatusOK, "", nil // the release that follows a failure's PATCH, which ended the lease already
		}
		if !j.held() && j.Holder == c.factory && j.LeaseEpoch == req.LeaseEpoch {
			// The lease a legacy PATCH to failed or queued left held: the
			// release frees it, the reported stage stays.
			j.Holder, j.LeaseExpiresAt = "", time.Time{}
			j.Last = &LastReport{Kind: "release", Factory: c.factory, Epoch: req.LeaseEpoch, Stage: j.Stage}
			return 0, "", []Event{{JobID: j.ID, Kind: "released", Factory: c.factory, Epoch: j.LeaseEpoch, Stage: j.Stage}}
		}
		if why := holds(j, c.factory, s.epoch(j, req.LeaseEpoch)); why != "" {
			return http.StatusConflict, why, nil
		}
		j.Stage, j.Holder, j.LeaseExpiresAt = StageQueued, "", time.Time{}
		if j.Attempts > 0 {
			j.Attempts-- // released unstarted: not an attempt
		}
		j.Last = &LastReport{Kind: "release", Factory: c.factory, Epoch: req.LeaseEpoch, Stage: StageQueued}
		return 0, "", []Event{{JobID: j.ID, Kind: "released", Factory: c.factory, Epoch: j.LeaseEpoch, Stage: j.Stage}}
	})
	if ok {
		writeJSON(w, http.StatusOK, map[string]string{"stage": j.Stage})
	}
}

// ---- reports ----

type patchReq struct {
	Stage      string          `json:"stage"`
	LeaseEpoch int64           `json:"leaseEpoch"`
	Checkpoint string          `json:"checkpoint"`
	Reason     string          `json:"reason"`
	Detail     string          `json:"detail"`
	Insights   json.RawMessage `json:"insights"`
	Branch     string          `json:"branch"`
	PRURL      string          `json:"prUrl"`
}

var patchStages = []string{StageBuilding, StageReview, StageTesting, StageShipped, StageFailed, StageQueued}

// handlePatch is the fenced stage report: only the holder at the current
// epoch may move the job (assigned|building → building|review|testing|
// shipped|failed|queued); a repeat of the last accepted report is answered
// 200. A report other than building ends the lease — except, in the legacy
// route set, a failed or queued one: today's coordinator records the stage
// and leaves the lease to lease/release (or the reaper), which is why aq
// follows such a PATCH with a release.
func (s *Server) handlePatch(w http.ResponseWriter, r *http.Request, c who) {
	var req patchReq
	if !decode(w, r, &req) {
		return
	}
	if !slices.Contains(patchStages, req.Stage) {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("stage %q is not one of %s", req.Stage, strings.Join(patchStages, ", ")))
		return
	}
	shipped := false
	rc := Call{Route: RoutePatch, Factory: c.factory, Epoch: req.LeaseEpoch, Stage: req.Stage, Reason: req.Reason}
	j, ok := s.leaseCall(w, rc, r.PathValue("id"), func(j *Job, now time.Time) (int, string, []Event) {
		// A re-send of the last accepted report (its answer was lost) is
		// idempotent only while nothing happened to the job since: the
		// epoch still current, and a report that keeps the lease (building)
		// only while the lease is still this factory's — else a zombie's
		// re-sent building would be told it still holds the job.
		// A building report that carries a new checkpoint is not a re-send.
		if l := j.Last; l != nil && l.Kind == "patch" && l.Factory == c.factory && l.Epoch == req.LeaseEpoch && l.Stage == req.Stage &&
			j.LeaseEpoch == req.LeaseEpoch && (req.Stage != StageBuilding || holds(j, c.factory, s.epoch(j, req.LeaseEpoch)) == "") &&
			(req.Checkpoint == "" || req.Checkpoint == j.Checkpoint || s.broken(BreakDropCheckpoint)) && !s.broken(BreakResendConflict) {
			return http.StatusOK, "", nil // a re-sent report
		}
		if why := holds(j, c.factory, s.epoch(j, req.LeaseEpoch)); why != "" {
			return http.StatusConflict, why, nil
		}
		j.Stage = req.Stage
		if req.Checkpoint != "" {
			j.Checkpoint = req.Checkpoint
		}
		j.record(req.Insights)
		if req.Branch != "" {
			j.Branch = req.Branch
		}
		if req.PRURL != "" {
			j.PRURL = req.PRURL
		}
		j.Reason = req.Reason
		if req.Detail != "" {
			j.Detail = req.Detail
		}
		if req.Stage == StageFailed || req.Stage == StageQueued {
			j.ended(req.Reason, req.Detail, req.Insights)
		}
		keep := s.legacy() && (req.Stage == StageFailed || req.Stage == StageQueued)
		if req.Stage != StageBuilding && !keep {
			j.Holder, j.LeaseExpiresAt = "", time.Time{} // the run is over: the lease ends
		}
		shipped = req.Stage == StageShipped
		j.Last = &LastReport{Kind: "patch", Factory: c.factory, Epoch: req.LeaseEpoch, Stage: req.Stage}
		return 0, "", []Event{{JobID: j.ID, Kind: "stage", Factory: c.factory, Epoch: j.LeaseEpoch, Stage: j.Stage}}
	})
	if !ok {
		return
	}
	if shipped {
		s.unblock()
	}
	writeJSON(w, http.StatusOK, j)
}

type failReq struct {
	JobID      string `json:"jobId"`
	FactoryID  string `json:"factoryId"`
	LeaseEpoch int64  `json:"leaseEpoch"`
	Reason     string `json:"reason"`
	Retryable  bool   `json:"retryable"`
	Checkpoint string `json:"checkpoint"`
	Detail     string `json:"detail"`
	// Insights: the failed run's usage (tokens, cost), recorded on the job
	// and added to its spend like a success's.
	Insights json.RawMessage `json:"insights"`
	// NotBefore: a parked run (reason rate_limited) — the job is not handed
	// out again before it (the engine's reset).
	NotBefore time.Time `json:"notBefore"`
}

// handleFail ends the holder's run with a failure and releases the lease at
// once: retryable with retries left → queued (after the job's backoff),
// retries exhausted → dead_letter, not retryable → failed. A parked run
// (rate_limited) → queued until its notBefore, the attempt not counted.
func (s *Server) handleFail(w http.ResponseWriter, r *http.Request, c who) {
	var req failReq
	if !decode(w, r, &req) || !sameFactory(w, c, req.FactoryID) {
		return
	}
	if req.Reason == "" {
		writeErr(w, http.StatusBadRequest, "reason is required")
		return
	}
	rc := Call{Route: RouteFail, Factory: c.factory, Epoch: req.LeaseEpoch, Reason: req.Reason}
	j, ok := s.leaseCall(w, rc, req.JobID, func(j *Job, now time.Time) (int, string, []Event) {
		if l := j.Last; l != nil && l.Kind == "fail" && l.Factory == c.factory && l.Epoch == req.LeaseEpoch && j.LeaseEpoch == req.LeaseEpoch && !s.broken(BreakResendConflict) {
			return http.StatusOK, "", nil // a re-sent report
		}
		if why := holds(j, c.factory, s.epoch(j, req.LeaseEpoch)); why != "" {
			return http.StatusConflict, why, nil
		}
		stage, nb := afterFail(j, job.Reason(req.Reason), req.Retryable, now, s.o.MaxBackoff)
		if job.Reason(req.Reason).Parks() && !s.broken(BreakIgnoreNotBefore) {
			stage, nb = afterPark(j, req.NotBefore, now)
		} else if job.Reason(req.Reason).Parks() {
			stage, nb = StageQueued, time.Time{} // the break: a park is any retryable failure, handed out at once
		}
		j.Stage, j.NotBefore, j.Waiting = stage, nb, stage == StageQueued && nb.After(now)
		j.Holder, j.LeaseExpiresAt = "", time.Time{}
		j.Reason, j.Detail = req.Reason, req.Detail
		if req.Checkpoint != "" {
			j.Checkpoint = req.Checkpoint
		}
		j.record(req.Insights)
		j.ended(req.Reason, req.Detail, req.Insights)
		j.Last = &LastReport{Kind: "fail", Factory: c.factory, Epoch: req.LeaseEpoch, Stage: stage}
		return 0, "", []Event{{JobID: j.ID, Kind: "fail", Factory: c.factory, Epoch: j.LeaseEpoch, Stage: stage, Detail: req.Reason}}
	})
	if ok {
		writeJSON(w, http.StatusOK, map[string]string{"stage": j.Stage})
	}
}

// ---- jobs ----

type submitReq struct {
	Manifest       *job.Job `json:"manifest"`
	BodyMd         string   `json:"bodyMd"`
	IdempotencyKey string   `json:"idempotencyKey"`
}

// handleSubmit creates a job from {manifest, bodyMd, idempotencyKey?}: the
// job id is the manifest's. An idempotency key seen before, or the same id
// with the same bodyMd (a retried submit), answers the existing job.
func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request, _ who) {
	var req submitReq
	if !decode(w, r, &req) {
		return
	}
	m := req.Manifest
	switch {
	case m == nil:
		writeErr(w, http.StatusBadRequest, "manifest is required")
		return
	case strings.TrimSpace(req.BodyMd) == "":
		writeErr(w, http.StatusBadRequest, "bodyMd (the verbatim manifest) is required")
		return
	case !validID(m.ID):
		writeErr(w, http.StatusBadRequest, "manifest.id is missing or not a valid id")
		return
	case m.Repo == "":
		writeErr(w, http.StatusBadRequest, "manifest.repo is required")
		return
	}
	key := req.IdempotencyKey
	if key == "" {
		key = m.IdempotencyKey
	}
	snap, _ := json.Marshal(m)
	product := m.Product
	if product == "" {
		product = r.Header.Get("x-product-id")
	}
	for range 50 {
		all := s.st.jobs()
		for _, o := range all {
			if key != "" && o.IdempotencyKey == key {
				writeJSON(w, http.StatusOK, map[string]any{"jobId": o.ID, "stage": o.Stage, "duplicate": true})
				return
			}
		}
		if o, ok := s.st.job(m.ID); ok {
			if o.BodyMd == req.BodyMd {
				writeJSON(w, http.StatusOK, map[string]any{"jobId": o.ID, "stage": o.Stage, "duplicate": true})
				return
			}
			writeErr(w, http.StatusConflict, fmt.Sprintf("job %s already exists with another manifest (give the new one another id)", m.ID))
			return
		}
		now := s.o.Now().UTC()
		j := Job{
			ID: m.ID, ProductID: product, Repo: m.Repo, RepoURL: m.RepoURL, Base: m.Base, Stage: StageQueued,
			Capabilities: append([]string{}, m.Capabilities...), Engine: m.Engine, Priority: m.Priority,
			BodyMd: req.BodyMd, ManifestSnapshot: snap, IdempotencyKey: key, Deps: m.Deps, DepsMode: m.DepsMode,
			Retry: m.Retry, CreatedAt: now,
		}
		stageOf := func(id string) (string, bool) {
			o, ok := s.st.job(id)
			return o.Stage, ok
		}
		if !depsShipped(&j, stageOf) {
			j.Stage = StageBlocked
		}
		nj, err := s.st.cas(j, now, Event{JobID: j.ID, Kind: "submitted", Epoch: 0, Stage: j.Stage})
		if err == errConflict {
			continue // created meanwhile: look again
		}
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusCreated, map[string]any{"jobId": nj.ID, "stage": nj.Stage})
		return
	}
	writeErr(w, http.StatusServiceUnavailable, "too much contention; try again")
}

func (s *Server) handleJobs(w http.ResponseWriter, r *http.Request, _ who) {
	stage := r.URL.Query().Get("stage")
	out := []Job{}
	for _, j := range s.st.jobs() {
		if stage == "" || j.Stage == stage {
			out = append(out, j)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": out})
}

func (s *Server) handleJob(w http.ResponseWriter, r *http.Request, _ who) {
	j, ok := s.st.job(r.PathValue("id"))
	if !ok {
		writeErr(w, http.StatusNotFound, "no job "+r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, j)
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, _ who) {
	if _, ok := s.st.job(r.PathValue("id")); !ok {
		writeErr(w, http.StatusNotFound, "no job "+r.PathValue("id"))
		return
	}
	ev := s.st.events(r.PathValue("id"))
	if ev == nil {
		ev = []Event{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": ev})
}

// actionReq is an action's optional body: the reason recorded on the job
// (reject).
type actionReq struct {
	Detail string `json:"detail"`
}

// handleAction is an operator's action on a job: requeue, ship or reject.
// The body is optional ({"detail": "why"}).
func (s *Server) handleAction(w http.ResponseWriter, r *http.Request, _ who) {
	var req actionReq
	if b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10)); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		if err := json.Unmarshal(b, &req); err != nil {
			writeErr(w, http.StatusBadRequest, "the body is not valid JSON: "+err.Error())
			return
		}
	}
	j, err := s.ActionWith(r.PathValue("id"), r.PathValue("action"), req.Detail)
	if err != nil {
		var ae *ActionError
		if errors.As(err, &ae) {
			writeErr(w, ae.Code, ae.Msg)
			return
		}
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, j)
}

// ActionError is an action the job's state does not allow.
type ActionError struct {
	Code int
	Msg  string
}

func (e *ActionError) Error() string { return e.Msg }

// Action applies an operator action: requeue (back to queued — or blocked —
// with the epoch bumped, which fences the current holder; checkpoint kept),
// ship (review|testing → shipped) or reject (→ failed, fencing a holder). A
// shipped job can be neither requeued nor rejected (409).
func (s *Server) Action(id, action string) (Job, error) { return s.ActionWith(id, action, "") }

// ActionWith is Action with the reason an operator gave (reject's detail).
func (s *Server) ActionWith(id, action, detail string) (Job, error) {
	var fn func(j *Job, now time.Time) (int, string, []Event)
	shipped := func(j *Job) (int, string, []Event) {
		return http.StatusConflict, fmt.Sprintf("job %s is shipped; a shipped job cannot be %sed (submit a new job instead)", j.ID, strings.TrimSuffix(action, "e")), nil
	}
	switch action {
	case "requeue":
		stageOf := func(d string) (string, bool) {
			o, ok := s.st.job(d)
			return o.Stage, ok
		}
		fn = func(j *Job, now time.Time) (int, string, []Event) {
			if j.Stage == StageShipped {
				return shipped(j)
			}
			holder := j.Holder
			j.LeaseEpoch++
			j.Holder, j.LeaseExpiresAt, j.NotBefore, j.Waiting, j.Last = "", time.Time{}, time.Time{}, false, nil
			j.Reason, j.Detail, j.Previous = "", "requeued by an operator", nil
			j.Stage = StageQueued
			if !depsShipped(j, stageOf) {
				j.Stage = StageBlocked
			}
			return 0, "", []Event{{JobID: j.ID, Kind: "requeued", Factory: holder, Epoch: j.LeaseEpoch, Stage: j.Stage, Detail: "holder fenced"}}
		}
	case "ship":
		fn = func(j *Job, now time.Time) (int, string, []Event) {
			if j.Stage != StageReview && j.Stage != StageTesting {
				return http.StatusConflict, fmt.Sprintf("job %s is %s; only review or testing jobs ship", j.ID, j.Stage), nil
			}
			j.Stage = StageShipped
			return 0, "", []Event{{JobID: j.ID, Kind: "shipped", Epoch: j.LeaseEpoch, Stage: j.Stage}}
		}
	case "reject":
		fn = func(j *Job, now time.Time) (int, string, []Event) {
			if j.Stage == StageShipped {
				return shipped(j)
			}
			if j.held() {
				j.LeaseEpoch++
			}
			why := "rejected by an operator"
			if d := strings.TrimSpace(detail); d != "" {
				why = d
			}
			j.Holder, j.LeaseExpiresAt = "", time.Time{}
			j.Stage, j.Reason, j.Detail = StageFailed, string(job.ReasonRejected), why
			return 0, "", []Event{{JobID: j.ID, Kind: "rejected", Epoch: j.LeaseEpoch, Stage: j.Stage}}
		}
	default:
		return Job{}, &ActionError{Code: http.StatusBadRequest, Msg: fmt.Sprintf("unknown action %q (requeue, ship, reject)", action)}
	}
	j, code, msg := s.mutate(id, fn)
	if code != 0 {
		return Job{}, &ActionError{Code: code, Msg: msg}
	}
	if j.Stage == StageShipped {
		s.unblock()
	}
	return j, nil
}

// ---- stats and faults ----

func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

type faultsReq struct {
	FailRate  float64  `json:"failRate"`
	LatencyMs int      `json:"latencyMs"`
	Routes    []string `json:"routes"`
}

func (s *Server) handleFaults(w http.ResponseWriter, r *http.Request, _ who) {
	var req faultsReq
	if !decode(w, r, &req) {
		return
	}
	if req.FailRate < 0 || req.FailRate > 1 {
		writeErr(w, http.StatusBadRequest, "failRate must be between 0 and 1")
		return
	}
	s.SetFaults(req.FailRate, time.Duration(req.LatencyMs)*time.Millisecond, req.Routes...)
	writeJSON(w, http.StatusOK, req)
}
