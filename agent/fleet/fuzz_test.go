package fleet

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/job"
)

// The wire's fuzz targets (issue #26, item 9). Their seed corpora are in
// testdata/fuzz/<target>/ (every hostile answer of the issue included) and
// run in plain `go test`; `make fuzz` runs each for FUZZTIME.

// FuzzClaimAnswer: a claim or accept answer, whatever its bytes, Date and
// the id asked for, is decoded or refused as a *ContractError; a decoded
// one has a lease of 0..MaxLease on this host's clock; and admission
// (manifest.Admit, fleet mode) admits only a job whose id and repo are
// valid, agree with its manifest's, and whose repo is a name.
func FuzzClaimAnswer(f *testing.F) {
	f.Add([]byte(`{"job":{"id":"j1","repo":"app","bodyMd":"---\nid: j1\nrepo: app\n---\n# x\n"},"leaseEpoch":1,"leaseExpiresAt":"2030-01-01T00:01:30Z"}`), "", int64(1893456000), false)
	f.Fuzz(func(t *testing.T, data []byte, asked string, date int64, over bool) {
		var cl Claim
		if err := decodeAnswer(data, over, maxAnswer, &cl); err != nil {
			if err.Cap == 0 && over || err.Cap != 0 && !over || strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("contract error %+v", err)
			}
			return
		}
		sent := time.Unix(1893456000, 0)
		exp := localExpiry(cl.LeaseExpiresAt, cl.TTL, answer{sentAt: sent, date: time.Unix(date, 0)})
		if cl.LeaseExpiresAt.IsZero() && cl.TTL <= 0 || math.IsNaN(cl.TTL) {
			// No time granted: the expiry is taken as sent (zero).
		} else if d := exp.Sub(sent); !exp.Equal(cl.LeaseExpiresAt) && (d < 0 || d > MaxLease) {
			t.Fatalf("a lease of %v from ttl %v, expiry %v, date %d", d, cl.TTL, cl.LeaseExpiresAt, date)
		}
		cl.Asked = asked
		j, ref := manifest.Admit(manifest.Wire{ID: cl.Job.ID, Repo: cl.Job.Repo, Asked: cl.Asked, BodyMd: cl.Job.BodyMd}, nil, manifest.Policy{Fleet: true})
		if ref != nil {
			if j != nil || ref.Reason == "" || ref.Msg == "" {
				t.Fatalf("refusal %+v with job %v", ref, j)
			}
			if ref.Reason == job.ReasonInvalidJob && (len(ref.Msg) > 600 || strings.ContainsAny(ref.Msg, "\n\r\x1b")) {
				t.Fatalf("an invalid_job refusal is not one short printable line: %q", ref.Msg)
			}
			return
		}
		if !job.ValidID(j.ID) || j.ID != cl.Job.ID || asked != "" && asked != j.ID {
			t.Fatalf("admitted id %q (coordinator %q, asked %q)", j.ID, cl.Job.ID, asked)
		}
		if mdmeta.CheckName(j.Repo) != "" || j.RepoURL != "" || cl.Job.Repo != "" && cl.Job.Repo != j.Repo {
			t.Fatalf("admitted repo %q (url %q, coordinator %q)", j.Repo, j.RepoURL, cl.Job.Repo)
		}
		if manifest.CheckBase(j.ID, j.Base) != "" {
			t.Fatalf("admitted base %q", j.Base)
		}
	})
}

// FuzzCoordinatorAnswer: any answer to any of the calls that decode one
// is the contract's JSON or a *ContractError naming what it is — never a
// panic, never a truncated body blamed on its JSON.
func FuzzCoordinatorAnswer(f *testing.F) {
	f.Add(uint8(0), []byte(`{"leaseExpiresAt":"2030-01-01T00:00:00Z","ttl":90}`), false)
	f.Fuzz(func(t *testing.T, kind uint8, data []byte, over bool) {
		outs := []func() any{
			func() any { return &Lease{} }, func() any { return &FailAnswer{} }, func() any { return &Enrollment{} },
			func() any { return &QueueState{} }, func() any { return &SubmitAnswer{} }, func() any { return &Job{} },
			func() any { return &JobDoc{} }, func() any { return &[]JobEvent{} },
		}
		out := outs[int(kind)%len(outs)]()
		err := decodeAnswer(data, over, maxAnswer, out)
		switch {
		case over && (err == nil || err.Cap != maxAnswer):
			t.Fatalf("an answer over the cap: %v", err)
		case err != nil && !over && err.Detail == "":
			t.Fatalf("a contract error that says nothing: %+v", err)
		case err != nil:
			err.Call, err.Status, err.ContentType = "POST /fleet/x", 200, "text/html"
			var ce *ContractError
			if msg := err.Error(); !errors.As(error(err), &ce) || !strings.Contains(msg, "the coordinator's answer to POST /fleet/x") {
				t.Fatalf("message %q", msg)
			}
		}
	})
}

// FuzzSpoolReport: any spool file — name and content — is read as a report
// whose name is its own job's, or refused (Pending moves it to dead/): a
// report the spool keeps can always be removed by the name it is read from.
func FuzzSpoolReport(f *testing.F) {
	f.Add("00000000000000000001-j1.json", []byte(`{"v":1,"seq":1,"kind":"fail","jobId":"j1","leaseEpoch":1,"fail":{"jobId":"j1","leaseEpoch":1,"reason":"crash"}}`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		r, err := readReport(name, data)
		if err != nil {
			return
		}
		if fileName(r) != name || spoolKey(r.JobID) != spoolName().FindStringSubmatch(name)[2] {
			t.Fatalf("report of job %q read from %q would be removed as %q", r.JobID, name, fileName(r))
		}
		switch r.Kind {
		case KindPatch:
			if r.Patch == nil {
				t.Fatal("a patch without its body")
			}
		case KindFail:
			if r.Fail == nil || r.Fail.JobID != r.JobID {
				t.Fatalf("a fail of job %v in a report of %q", r.Fail, r.JobID)
			}
		case KindArtifact:
			if r.Artifact == nil {
				t.Fatal("an artifact without its body")
			}
		default:
			t.Fatalf("kind %q", r.Kind)
		}
		// What a new report for this job would be called is safe too.
		if k := spoolKey(r.JobID); strings.ContainsAny(k, `/\`) || k == "." || k == ".." {
			t.Fatalf("key %q", k)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatal(err)
		}
	})
}
