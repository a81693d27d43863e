package fleet

import (
	"bytes"
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

var (
	idLogged   = testenv.ID("logged")
	idUnsent   = testenv.ID("unsent")
	idNoRoute1 = testenv.ID("noroute-1")
	idNoRoute2 = testenv.ID("noroute-2")
)

// TestArtifactsAfterFinalReport: after a job's terminal report the factory
// uploads its engine output and stderr as artifacts — after the report,
// never before it — and the stub serves them back.
func TestArtifactsAfterFinalReport(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	s.submit(t, idLogged, "app", "script: "+w.script("talk", "echo 'hello from the engine'\necho 'a warning' >&2\necho x > x.txt\n")+"\nship: branch")
	f := newFactory(t, s, w, "f1")
	res, err := f.runOnce(t, ctxT(t))
	if err != nil || res.Report != "delivered" || res.Stage != job.Shipped {
		t.Fatalf("%+v %v", res, err)
	}
	arts := s.Artifacts(idLogged)
	byName := map[string]coord.Artifact{}
	for _, a := range arts {
		byName[a.Name] = a
	}
	out, ok := byName["engine-stdout"]
	if !ok || out.Kind != "transcript" || out.LeaseEpoch != 1 || out.Attempt != 1 || out.FactoryID != "f1" || out.Truncated {
		t.Fatalf("artifacts %+v", arts)
	}
	if _, ok := byName["engine-stderr"]; !ok {
		t.Fatalf("no stderr artifact: %+v", arts)
	}
	content, _ := s.ArtifactContent(out.ID)
	if !strings.Contains(string(content), "hello from the engine") || !strings.Contains(string(content), "=== aq job "+idLogged+" attempt 1") {
		t.Fatalf("transcript content %q", content)
	}
	j, _ := s.Job(idLogged)
	if out.CreatedAt.Before(j.UpdatedAt) {
		t.Fatalf("artifact stored at %s, before the final report (%s)", out.CreatedAt, j.UpdatedAt)
	}
	if n := f.Agent.Artifacts.Reporter.Spool.Depth(); n != 0 {
		t.Fatalf("%d uploads left in the artifact spool", n)
	}
}

// TestArtifactUploadSpooledNeverBlocksReport: with the artifacts route
// failing, the final report is still delivered at once; the uploads wait in
// the artifact spool (not the report spool) and are delivered when the
// coordinator takes them again.
func TestArtifactUploadSpooledNeverBlocksReport(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	s := startStub(t, coord.Options{FailRate: 1, FaultRoutes: []string{coord.RouteArtifactUpload}})
	w := newWorld(t, "app")
	s.submit(t, idUnsent, "app", "script: echo out; echo y > y.txt\nship: branch")
	f := newFactory(t, s, w, "f1")
	res, err := f.runOnce(t, ctxT(t))
	if err != nil || res.Report != "delivered" {
		t.Fatalf("%+v %v", res, err)
	}
	if j, _ := s.Job(idUnsent); j.Stage != coord.StageShipped {
		t.Fatalf("job %s", j.Stage)
	}
	if n := f.Agent.Reporter.Spool.Depth(); n != 0 {
		t.Fatalf("the report spool holds %d: uploads went there", n)
	}
	if n := f.Agent.Artifacts.Reporter.Spool.Depth(); n < 1 {
		t.Fatalf("the failed uploads are not in the artifact spool (%d)", n)
	}
	if len(s.Artifacts(idUnsent)) != 0 {
		t.Fatal("stored despite the faults")
	}
	s.SetFaults(0, 0)
	dr, err := f.Agent.Artifacts.Reporter.Drain(ctxT(t))
	if err != nil || dr.Delivered < 1 || f.Agent.Artifacts.Reporter.Spool.Depth() != 0 {
		t.Fatalf("drain %+v %v", dr, err)
	}
	if a := s.Artifacts(idUnsent); len(a) < 1 || a[0].Name != "engine-stdout" {
		t.Fatalf("after the drain: %+v", a)
	}
}

// TestArtifactsWithoutRouteSkippedOnce: a coordinator without the
// artifacts route gets one upload attempt per process, one warning, and
// nothing waits in any spool.
func TestArtifactsWithoutRouteSkippedOnce(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	s := startStub(t, coord.Options{Without: []string{coord.RouteArtifactUpload}})
	w := newWorld(t, "app")
	s.submit(t, idNoRoute1, "app", "script: echo one; echo 1 > 1.txt\nship: branch")
	s.submit(t, idNoRoute2, "app", "script: echo two; echo 2 > 2.txt\nship: branch")
	f := newFactory(t, s, w, "f1")
	for range 2 {
		if res, err := f.runOnce(t, ctxT(t)); err != nil || res.Report != "delivered" {
			t.Fatalf("%+v %v", res, err)
		}
	}
	if n := s.Stats().Count(coord.RouteArtifactUpload); n != 1 {
		t.Fatalf("%d upload attempts, want 1 for the process's life", n)
	}
	if n := strings.Count(f.Logs.String(), "the coordinator has no "+RouteArtifacts+" route"); n != 1 {
		t.Fatalf("%d warnings:\n%s", n, f.Logs.String())
	}
	if d := f.Agent.Artifacts.Reporter.Spool; d.Depth() != 0 || len(d.Dead()) != 0 {
		t.Fatalf("artifact spool: %d waiting, %v dead", d.Depth(), d.Dead())
	}
}

// TestArtifactBuildMasksAndCaps: an artifact is masked with the redactor,
// and one over the cap keeps its head and its end around a visible marker,
// within the cap — truncated, never dropped.
func TestArtifactBuildMasksAndCaps(t *testing.T) {
	t.Parallel()
	logs := t.TempDir()
	dir := filepath.Join(logs, "j")
	const secret = "s3cr3t-v4lue-0123456789"
	var big bytes.Buffer
	big.WriteString(`{"type":"system","note":"FIRST LINE token=` + secret + `"}` + "\n")
	for big.Len() < 300_000 {
		big.WriteString(`{"type":"assistant","message":{"content":"filler filler filler"}}` + "\n")
	}
	big.WriteString("LAST LINE " + secret + "\n")
	testenv.WriteFile(t, filepath.Join(dir, "stdout.log"), big.String())
	testenv.WriteFile(t, filepath.Join(dir, "stderr.log"), "short "+secret+"\n")
	a := &Artifacts{LogsDir: logs, Redactor: secrets.NewRedactor(nil, secret), MaxBytes: 64 << 10}
	ups, err := a.Build("j", 3, 2)
	if err != nil || len(ups) != 2 {
		t.Fatalf("%d uploads, %v", len(ups), err)
	}
	for _, up := range ups {
		b, err := gunzip(decodeB64(t, up.Data), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), secret) {
			t.Errorf("%s: the secret is in the artifact", up.Name)
		}
		if int64(len(b)) != up.Size || up.LeaseEpoch != 3 || up.Attempt != 2 || up.Encoding != "gzip" {
			t.Errorf("%s: size %d (content %d) epoch %d attempt %d", up.Name, up.Size, len(b), up.LeaseEpoch, up.Attempt)
		}
		switch up.Name {
		case "engine-stdout":
			if !up.Truncated || up.Size > 64<<10 || up.OriginalSize != int64(big.Len()) || up.ContentType != "application/x-ndjson" {
				t.Errorf("capped artifact: %+v", up)
			}
			s := string(b)
			if !strings.HasPrefix(s, `{"type":"system","note":"FIRST LINE token=`+secrets.Mask) || !strings.HasSuffix(s, "LAST LINE "+secrets.Mask+"\n") || !strings.Contains(s, "bytes cut here: an artifact carries at most 65536 bytes") {
				t.Errorf("capped content: head %q … tail %q", s[:60], s[len(s)-60:])
			}
		case "engine-stderr":
			if up.Truncated || string(b) != "short "+secrets.Mask+"\n" {
				t.Errorf("stderr %q truncated %v", b, up.Truncated)
			}
		}
	}
	if ups, err := a.Build("no-such-job", 1, 1); err != nil || len(ups) != 0 {
		t.Fatalf("a job without logs: %v %v", ups, err)
	}

}

func decodeB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
