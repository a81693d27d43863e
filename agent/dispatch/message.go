// Package dispatch owns the factory's side of Service Bus delivery
// (docs/servicebus.md; the message and its settlement in docs/contract.md,
// "Broker messages"; the background is the coordinator team's "Fleet dispatch redesign"): it receives the targeted dispatch
// messages of this factory's subscription with the azservicebus SDK (PeekLock),
// asks the coordinator to accept each job through a consumer-side Acceptor,
// settles the message by the outcome table, hands accepted jobs to a Handler,
// and reports the broker link's health so that the daemon can fall back to
// polling while the broker is unreachable.
//
// It does not import the fleet client: the Acceptor and the error predicates
// in outcome.go are the contract the fleet client satisfies.
package dispatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/job"
)

// Message is a dispatch message (docs/contract.md, "Broker messages"): small, no job body. The broker
// is transport; the coordinator holds the job.
type Message struct {
	JobID           string   `json:"jobId"`
	ProductID       string   `json:"productId"`
	Repo            string   `json:"repo"`
	Caps            []string `json:"caps"`
	Priority        int      `json:"priority"`
	TargetFactoryID string   `json:"targetFactoryId"`
}

// Application property names: the same fields as the body, so that a
// subscription rule can filter on them (targetFactoryId is the routing key).
const (
	PropJobID           = "jobId"
	PropProductID       = "productId"
	PropRepo            = "repo"
	PropCaps            = "caps"
	PropPriority        = "priority"
	PropTargetFactoryID = "targetFactoryId"
)

// ServiceBusMessage builds the message a publisher sends for m:
// MessageID = jobId (the broker's duplicate detection collapses re-publishes),
// the body as JSON, the same fields as application properties (caps as one
// comma-separated string: AMQP application properties are simple values),
// and SessionID = repo when withSession is set.
func (m Message) ServiceBusMessage(withSession bool) (*azservicebus.Message, error) {
	return m.ServiceBusMessageWithID(m.JobID, withSession)
}

// DispatchMessageID is the MessageID of one dispatch of a job: jobId, a
// colon, and the dispatch generation — the job's lease epoch while it waits
// in queued (every lease bumps it, so each return to queued — a retry, a
// reap, a requeue, a release — is a new generation) and, when the publisher
// re-targets the same generation to another factory, "." and a count.
// Duplicate detection then collapses re-publishes of one dispatch (a
// publisher restart) but never a new dispatch of the same job, which a
// MessageID of the bare jobId would drop for the whole detection window.
func DispatchMessageID(jobID string, epoch int64, retarget int) string {
	id := jobID + ":" + strconv.FormatInt(epoch, 10)
	if retarget > 0 {
		id += "." + strconv.Itoa(retarget)
	}
	return id
}

// ServiceBusMessageWithID is ServiceBusMessage with another MessageID (see
// DispatchMessageID). The factory accepts a MessageID that is the body's
// jobId or starts with jobId + ":".
func (m Message) ServiceBusMessageWithID(messageID string, withSession bool) (*azservicebus.Message, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	id := messageID
	ct := "application/json"
	out := &azservicebus.Message{
		MessageID:   &id,
		ContentType: &ct,
		Body:        body,
		ApplicationProperties: map[string]any{
			PropJobID:           m.JobID,
			PropProductID:       m.ProductID,
			PropRepo:            m.Repo,
			PropCaps:            strings.Join(m.Caps, ","),
			PropPriority:        int64(m.Priority),
			PropTargetFactoryID: m.TargetFactoryID,
		},
	}
	if withSession && m.Repo != "" {
		repo := m.Repo
		out.SessionID = &repo
	}
	return out, nil
}

// Reasons a message is dead-lettered (DeadLetterReason).
const (
	ReasonMalformed   = "MalformedDispatchMessage"
	ReasonMistargeted = "NotForThisFactory"
	// ReasonUnfit: the job needs a capability or repo this factory no
	// longer offers (Options.Unfit).
	ReasonUnfit = "CapabilityGone"
)

// invalid says why a message cannot be acted on: it is dead-lettered with
// Reason and Description.
type invalid struct {
	Reason      string
	Description string
}

func (e *invalid) Error() string { return e.Reason + ": " + e.Description }

// parse reads a received message into a Message and checks that it is one
// this factory may act on. Every failure is an *invalid: a body that is not
// a dispatch message, a missing jobId or target, a routing property
// (targetFactoryId, jobId) that disagrees with the body, or another target.
// What does not stop the job comes back as a warning, the body being
// authoritative: a MessageID that is neither jobId nor jobId:generation (a
// dispatcher may leave it to the SDK or the broker), a productId or repo
// property that disagrees with the body. A message targeted at pool (when
// this factory is a replica of one) is this factory's as much as one
// targeted at factoryID.
func parse(body []byte, messageID string, props map[string]any, factoryID, pool string) (m Message, warning string, err error) {
	m, err = parseBody(body)
	if err != nil {
		return m, "", err
	}
	if messageID != "" && messageID != m.JobID && !strings.HasPrefix(messageID, m.JobID+":") {
		warning = fmt.Sprintf("MessageID %s is not the body's jobId %s (nor jobId:generation); the body's jobId is used", quote(messageID), quote(m.JobID))
	}
	for _, p := range []struct {
		name, body string
		routing    bool
	}{{PropTargetFactoryID, m.TargetFactoryID, true}, {PropJobID, m.JobID, true}, {PropProductID, m.ProductID, false}, {PropRepo, m.Repo, false}} {
		v, ok := props[p.name]
		if !ok {
			continue
		}
		if s, _ := v.(string); s != p.body {
			msg := fmt.Sprintf("application property %s %s disagrees with the body's %s", p.name, quote(fmt.Sprint(v)), quote(p.body))
			if p.routing {
				return m, "", &invalid{ReasonMalformed, msg}
			}
			warning = strings.TrimPrefix(warning+"; "+msg+"; the body's is used", "; ")
		}
	}
	if m.TargetFactoryID != factoryID && (pool == "" || m.TargetFactoryID != pool) {
		this := "this factory is " + quote(factoryID)
		if pool != "" {
			this += " of pool " + quote(pool)
		}
		return m, "", &invalid{ReasonMistargeted, fmt.Sprintf("targetFactoryId is %s, %s (check the subscription's rules)", quote(m.TargetFactoryID), this)}
	}
	return m, warning, nil
}

// parseBody reads the JSON body; a message without jobId or target is
// malformed.
func parseBody(body []byte) (Message, error) {
	var m Message
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&m); err != nil {
		return m, &invalid{ReasonMalformed, "body is not a dispatch message: " + brief.Clip(err.Error(), 200)}
	}
	if dec.More() {
		return m, &invalid{ReasonMalformed, "body has data after the JSON object"}
	}
	switch {
	case m.JobID == "":
		return m, &invalid{ReasonMalformed, "body has no jobId"}
	case m.TargetFactoryID == "":
		return m, &invalid{ReasonMalformed, "body has no targetFactoryId"}
	}
	// The same rule as every job's (manifest.Admit): an id that is not one
	// is never accepted, whatever the coordinator would answer for it.
	if msg := job.CheckID(m.JobID); msg != "" {
		return m, &invalid{ReasonMalformed, "jobId " + job.Show(m.JobID) + " is not a job id: it " + msg}
	}
	if m.Repo != "" {
		if msg := mdmeta.CheckName(m.Repo); msg != "" {
			return m, &invalid{ReasonMalformed, "repo " + job.Show(m.Repo) + " is not a repository name: it " + msg}
		}
	}
	return m, nil
}

// quoteRunes is how much of a broker-supplied value quote keeps.
const quoteRunes = 40

// quote shows a broker-supplied value in a description: cut to 40 runes,
// then quoted (a byte that is not printable is escaped) — short whatever
// it holds, which quoting after a cut by bytes was not (found by
// FuzzMessage: 200 bytes of \x80 quoted to 800 characters).
func quote(s string) string {
	if utf8.RuneCountInString(s) > quoteRunes {
		s = string([]rune(s)[:quoteRunes]) + "…"
	}
	return strconv.Quote(s)
}
