package coord

import (
	"time"
)

// Call is one answered lease call — claim, accept, renew, release, PATCH or
// fail — as Options.OnCall sees it, before the answer is written: what the
// caller carried, what the stub saw when it decided, and what it answered.
// It is the audit a fencing check needs: a call answered 2xx whose Epoch is
// not the JobEpoch the stub held is a stale (fenced) write accepted.
type Call struct {
	At      time.Time `json:"at"`
	Route   string    `json:"route"`
	JobID   string    `json:"jobId"`
	Factory string    `json:"factory"`
	// Epoch is the lease epoch the call carried (claim and accept: the one
	// they were granted; 0 when refused).
	Epoch int64 `json:"epoch"`
	// JobEpoch is the job's lease epoch when the stub decided (after the
	// bump, for a granted claim or accept).
	JobEpoch int64 `json:"jobEpoch"`
	// Holder is the lease holder when the stub decided, before the change.
	Holder string `json:"holder,omitempty"`
	// Stage is the stage a PATCH asked for, where a fail sent the job, or
	// "assigned" for a granted claim or accept.
	Stage    string `json:"stage,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Attempts int    `json:"attempts,omitempty"` // the job's run count when decided
	Status   int    `json:"status"`
	// Resend: answered 200 as a repeat of the last accepted report (or
	// release) of the same holder and epoch, without a change.
	Resend bool `json:"resend,omitempty"`
}

// call hands c to Options.OnCall.
func (s *Server) call(c Call) {
	if s.o.OnCall == nil {
		return
	}
	c.At = s.o.Now().UTC()
	s.o.OnCall(c)
}

// Snapshot is the stub's whole state as its state file holds it: what an
// audit reads after the stub has stopped (or been killed).
type Snapshot struct {
	Version   int64               `json:"version"`
	Jobs      map[string]*Job     `json:"jobs"`
	Factories map[string]*Factory `json:"factories"`
	// Events are each job's audit trail (at most the last 500 per job).
	Events map[string][]Event `json:"events"`
}

// MaxEvents is how many events a job's trail keeps.
const MaxEvents = maxEvents

// ReadStateFile reads a state file written with Options.StateFile.
func ReadStateFile(path string) (*Snapshot, error) {
	st, err := newStore(path)
	if err != nil {
		return nil, err
	}
	return &Snapshot{Version: st.st.Version, Jobs: st.st.Jobs, Factories: st.st.Factories, Events: st.st.Events}, nil
}
