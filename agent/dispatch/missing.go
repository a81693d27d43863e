package dispatch

import (
	"errors"
	"fmt"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
)

// MissingSubscriptionError is a receive that failed because the factory's
// subscription (or its topic) does not exist: a deployment mistake, not an
// outage — retrying does not mend it, creating the subscription does.
type MissingSubscriptionError struct {
	Topic, Subscription string
	Pool                string // the factory's pool, if any (the fix names it)
	Err                 error
}

func (e *MissingSubscriptionError) Error() string {
	fix := "aq servicebus ensure-subscription"
	if e.Pool != "" {
		fix += " --pool " + e.Pool
	}
	return fmt.Sprintf("the Service Bus subscription %s/%s does not exist: create it with `%s` (or point AQ_SB_SUBSCRIPTION at the right one)",
		e.Topic, e.Subscription, fix)
}

func (e *MissingSubscriptionError) Unwrap() error { return e.Err }

// IsMissingSubscription reports whether err says the subscription does not
// exist.
func IsMissingSubscription(err error) bool {
	var me *MissingSubscriptionError
	return errors.As(err, &me)
}

// missing wraps err as a MissingSubscriptionError when the broker said the
// entity is not found: the SDK's CodeNotFound, or the AMQP condition
// amqp:not-found that a refused link attach carries as it is (the SDK does
// not map the error of a $management link it opens for the first peek).
func (r *Receiver) missing(err error) error {
	var se *azservicebus.Error
	var ae *amqp.Error
	if (errors.As(err, &se) && se.Code == azservicebus.CodeNotFound) || (errors.As(err, &ae) && ae.Condition == amqp.ErrCondNotFound) {
		return &MissingSubscriptionError{Topic: r.opts.Topic, Subscription: r.opts.Subscription, Pool: r.opts.Pool, Err: err}
	}
	return err
}
