package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gofrs/flock"

	"github.com/aqfleet/aq/internal/atomicfile"
)

// Shadow is shadow mode (AQ_FLEET_SHADOW=1): the local queue decides what
// runs; before each local pick aq asks the coordinator which job it would
// hand out (a claim with dryRun: nothing is leased), and after it logs
// `shadow: AGREE` or `shadow: DIVERGE local=<id> fleet=<id>`. The counts are
// kept in $AQ_HOME/state/shadow.json for `aq status`.
type Shadow struct {
	Client *Client
	// Path is the counts file ($AQ_HOME/state/shadow.json).
	Path string
	// Prepare readies the client (credentials, capabilities) on first use.
	Prepare func(ctx context.Context) error
	Log     *slog.Logger

	once    sync.Once
	prepErr error
}

// ShadowCounts are shadow mode's tallies. Field names are stable.
type ShadowCounts struct {
	Agree       int           `json:"agree"`
	Diverge     int           `json:"diverge"`
	Errors      int           `json:"errors"` // dry runs that failed
	LastDiverge *ShadowSample `json:"lastDiverge,omitempty"`
	UpdatedAt   time.Time     `json:"updatedAt"`
}

// ShadowSample is one comparison.
type ShadowSample struct {
	Local string    `json:"local"`
	Fleet string    `json:"fleet"`
	At    time.Time `json:"at"`
}

// None stands for "no job" in a comparison.
const None = "-"

// Ask returns the job the coordinator would hand this factory now (None
// when none); ok is false when it could not tell (the error is logged and
// counted, never fatal: shadow mode has no side effects on the local run).
func (s *Shadow) Ask(ctx context.Context) (fleetPick string, ok bool) {
	s.once.Do(func() {
		if s.Prepare != nil {
			s.prepErr = s.Prepare(ctx)
		}
	})
	if s.prepErr != nil {
		s.log().Warn("shadow: cannot ask the coordinator", "err", s.prepErr)
		s.bump(func(c *ShadowCounts) { c.Errors++ })
		return "", false
	}
	cl, err := s.Client.Claim(ctx, true)
	if err != nil {
		s.log().Warn("shadow: dry-run claim failed", "err", err)
		s.bump(func(c *ShadowCounts) { c.Errors++ })
		return "", false
	}
	if cl == nil {
		return None, true
	}
	return cl.Job.ID, true
}

// Compare logs and counts one comparison of the local pick with the
// fleet's (None for no job). Two "no job" answers are not counted.
func (s *Shadow) Compare(local, fleet string) {
	if local == "" {
		local = None
	}
	if fleet == "" {
		fleet = None
	}
	if local == None && fleet == None {
		return
	}
	if local == fleet {
		s.log().Info("shadow: AGREE", "local", local, "fleet", fleet)
		s.bump(func(c *ShadowCounts) { c.Agree++ })
		return
	}
	s.log().Warn("shadow: DIVERGE local=" + local + " fleet=" + fleet)
	s.bump(func(c *ShadowCounts) {
		c.Diverge++
		c.LastDiverge = &ShadowSample{Local: local, Fleet: fleet, At: time.Now().UTC()}
	})
}

// bump updates the counts file under a lock (two aq processes may share it).
func (s *Shadow) bump(fn func(*ShadowCounts)) {
	if s.Path == "" {
		return
	}
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o700); err != nil {
		s.log().Warn("shadow: cannot keep counts", "err", err)
		return
	}
	fl := flock.New(s.Path + ".lock")
	if err := fl.Lock(); err != nil {
		s.log().Warn("shadow: cannot keep counts", "err", err)
		return
	}
	defer fl.Unlock()
	c, err := LoadShadowCounts(s.Path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log().Warn("shadow: counts file unreadable; starting over", "err", err)
	}
	if c == nil {
		c = &ShadowCounts{}
	}
	fn(c)
	c.UpdatedAt = time.Now().UTC()
	if err := atomicfile.WriteJSON(s.Path, c, 0o600); err != nil {
		s.log().Warn("shadow: cannot keep counts", "err", err)
	}
}

// LoadShadowCounts reads the counts file; fs.ErrNotExist when shadow mode
// never ran.
func LoadShadowCounts(path string) (*ShadowCounts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c ShadowCounts
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// ShadowFile is where shadow counts live under a state directory.
func ShadowFile(stateDir string) string { return filepath.Join(stateDir, "shadow.json") }

func (s *Shadow) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}
