package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

func TestSpoolOrderAcrossReopen(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	s, err := OpenSpool(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Append(PatchReport("j1", PatchRequest{Stage: "building", LeaseEpoch: 1}))
	b, _ := s.Append(FailReport(FailRequest{JobID: "j2", LeaseEpoch: 3, Reason: job.ReasonVerifyFailed, Retryable: true}))
	c, _ := s.Append(PatchReport("j1", PatchRequest{Stage: "testing", LeaseEpoch: 1}))
	if a.Seq != 1 || b.Seq != 2 || c.Seq != 3 {
		t.Fatalf("seqs %d %d %d", a.Seq, b.Seq, c.Seq)
	}
	// A restarted aq sees the same reports in the same order, and numbers
	// new ones after them.
	s2, _ := OpenSpool(dir)
	got, errs := s2.Pending()
	if len(errs) > 0 || len(got) != 3 || got[0].Patch.Stage != "building" || got[1].Fail.Reason != job.ReasonVerifyFailed || got[2].Patch.Stage != "testing" {
		t.Fatalf("pending %+v %v", got, errs)
	}
	if !s2.Has("j1") || !s2.Has("j2") || s2.Has("j3") {
		t.Fatal("Has")
	}
	if err := s2.Remove(got[0]); err != nil {
		t.Fatal(err)
	}
	d, _ := s2.Append(PatchReport("j3", PatchRequest{Stage: "building", LeaseEpoch: 1}))
	if d.Seq != 4 {
		t.Fatalf("seq after reopen %d", d.Seq)
	}
	// Refused reports are kept, with why.
	if err := s2.Reject(got[1], "400 bad request"); err != nil {
		t.Fatal(err)
	}
	if s2.Depth() != 2 || len(s2.Dead()) != 1 {
		t.Fatalf("depth %d dead %v", s2.Depth(), s2.Dead())
	}
	b2, _ := os.ReadFile(filepath.Join(dir, "dead", s2.Dead()[0]))
	if !strings.Contains(string(b2), "400 bad request") {
		t.Fatalf("dead report %s", b2)
	}
	// Files are fsynced JSON, one per report, named by seq.
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	if len(names) != 2 || names[0] != "00000000000000000003-j1.json" || names[1] != "00000000000000000004-j3.json" {
		t.Fatalf("files %v", names)
	}
}

func TestSpoolCorruptFileIsKeptAside(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	s, _ := OpenSpool(dir)
	os.WriteFile(filepath.Join(dir, "00000000000000000007-jx.json"), []byte("{not json"), 0o600)
	s.Append(PatchReport("j1", PatchRequest{Stage: "building", LeaseEpoch: 1}))
	got, errs := s.Pending()
	if len(got) != 1 || len(errs) != 1 || got[0].Seq != 8 {
		t.Fatalf("got %+v errs %v", got, errs)
	}
	if len(s.Dead()) != 1 {
		t.Fatalf("corrupt file not kept in dead/: %v", s.Dead())
	}
}

func TestSpoolConcurrentAppends(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	s1, _ := OpenSpool(dir)
	s2, _ := OpenSpool(dir) // a second aq process on the host
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := s1
			if i%2 == 1 {
				s = s2
			}
			if _, err := s.Append(PatchReport("j1", PatchRequest{Stage: "building", LeaseEpoch: int64(i)})); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, _ := s1.Pending()
	if len(got) != 20 {
		t.Fatalf("%d reports, want 20 (a sequence number was reused)", len(got))
	}
	for i, r := range got {
		if r.Seq != int64(i+1) {
			t.Fatalf("seq %d at %d", r.Seq, i)
		}
	}
}
