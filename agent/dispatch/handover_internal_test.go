package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/agent/claim"
)

// hangingSettler is a broker link that broke after the message came: a
// complete hangs until released (as on a dead connection, up to
// SettleTimeout).
type hangingSettler struct {
	started <-chan struct{} // closed when the Handler runs
	seen    chan bool       // whether the Handler ran before the complete returned
}

func (h *hangingSettler) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	// A deadlock guard only: with the handover first, the Handler has
	// started long before.
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-h.started:
		h.seen <- true
		return nil
	case <-t.C:
		h.seen <- false
		return errors.New("link lost")
	}
}

func (h *hangingSettler) AbandonMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.AbandonMessageOptions) error {
	return errors.New("unexpected abandon")
}

func (h *hangingSettler) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return errors.New("unexpected dead-letter")
}

// Found by the chaos harness: an accepted job waited for its message to be
// completed before it started, so a complete hanging on a broken link held
// back the job's lease renewal and its job record for up to SettleTimeout —
// the lease lapsed under a live factory, and a factory killed meanwhile did
// not know it held the job. The job must start (its lease in its runner's
// hands) whatever the settlement does.
func TestAcceptedJobStartsBeforeItsMessageIsSettled(t *testing.T) {
	started := make(chan struct{})
	slots := NewSemaphore(1)
	r, err := New(Options{
		Config: Config{FactoryID: "fa", ConnectionString: "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=k;UseDevelopmentEmulator=true"},
		Acceptor: AcceptFunc(func(context.Context, string) (Accepted, error) {
			return Accepted{Claim: &claim.Claim{Job: claim.Job{ID: "j1"}, LeaseEpoch: 7}}, nil
		}),
		Handler: func(_ context.Context, a Accepted) {
			if a.Claim.LeaseEpoch == 7 {
				close(started)
			}
		},
		Slots: slots,
	})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(Message{JobID: "j1", Repo: "r", TargetFactoryID: "fa"})
	s := &hangingSettler{started: started, seen: make(chan bool, 1)}
	if err := slots.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.handle(context.Background(), s, &azservicebus.ReceivedMessage{MessageID: "j1:0", Body: body}, slots.Release)
	if !<-s.seen {
		t.Fatal("the accepted job did not start while its message's complete hung: the lease waits on the broker")
	}
	r.jobs.Wait()
}
