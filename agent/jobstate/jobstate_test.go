package jobstate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/aqfleet/aq/job"
)

func TestPutGetUpdateList(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing record: %v", err)
	}
	r, err := s.Update("a", func(r *Record) { r.Repo, r.Stage, r.LeaseEpoch = "notes", job.Building, 3 })
	if err != nil || r.ID != "a" || !r.Running() {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := s.Update("a", func(r *Record) { r.Stage = job.Shipped; r.EndedAt = r.UpdatedAt.Add(1) }); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get("a")
	if got.Stage != job.Shipped || got.Repo != "notes" || got.LeaseEpoch != 3 || got.Running() {
		t.Fatalf("%+v", got)
	}
	os.WriteFile(filepath.Join(s.dir, "bad.json"), []byte("{"), 0o600)
	s.Put(Record{ID: "b"})
	list, errs := s.List()
	if len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" || len(errs) != 1 {
		t.Fatalf("list %+v errs %v", list, errs)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "bad.json")); err != nil {
		t.Fatal("a corrupt record must be kept")
	}
	if err := s.Put(Record{ID: "../x"}); err == nil {
		t.Fatal("path traversal accepted")
	}
}
