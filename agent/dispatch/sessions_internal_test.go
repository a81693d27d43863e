package dispatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/aqfleet/aq/internal/logging"
)

// scriptedSession is a held session whose renewals answer from a script
// (nil when it runs out); nothing else is used by renewSession.
type scriptedSession struct {
	sessionReceiver
	mu     sync.Mutex
	script []error
	renews int
}

func (s *scriptedSession) RenewSessionLock(context.Context, *azservicebus.RenewSessionLockOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renews++
	if len(s.script) == 0 {
		return nil
	}
	err := s.script[0]
	s.script = s.script[1:]
	return err
}

func (s *scriptedSession) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renews
}

// The renewer's verdicts: the broker saying the lock is lost, or another
// receiver holding the session (a raw *amqp.Error, matched by condition),
// end the hold at once; a failure it cannot read is retried until the lock
// would have run out; a failure followed by a success is no loss.
func TestRenewSessionVerdicts(t *testing.T) {
	transient := errors.New("link detached, retrying")
	for _, tc := range []struct {
		name     string
		script   []error
		lost     bool
		minTries int
	}{
		{"lock lost", []error{&azservicebus.Error{Code: azservicebus.CodeLockLost}}, true, 1},
		{"held by another receiver", []error{&amqp.Error{Condition: "com.microsoft:session-cannot-be-locked", Description: "held"}}, true, 1},
		{"failures until the lock ran out", []error{transient, transient, transient, transient, transient, transient, transient, transient, transient, transient, transient, transient}, true, 0},
		{"a failure, then renewed", []error{transient}, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Receiver{opts: Options{SettleTimeout: time.Second}, log: logging.Discard(), metrics: MetricsFuncs{}}
			s := &scriptedSession{script: tc.script}
			lost := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.renewSession(ctx, s, 200*time.Millisecond, lost, r.log)
			}()
			if tc.lost {
				<-lost
				<-done
				if tc.minTries == 1 && s.count() != 1 {
					t.Fatalf("%d renewals: the loss is final at the first answer", s.count())
				}
				cancel()
				return
			}
			for s.count() < tc.minTries {
				select {
				case <-lost:
					t.Fatalf("lost after %d renewals", s.count())
				case <-time.After(10 * time.Millisecond):
				}
			}
			cancel()
			<-done
			select {
			case <-lost:
				t.Fatal("lost")
			default:
			}
		})
	}
}
