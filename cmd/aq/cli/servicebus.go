package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/internal/aqerr"
)

func init() { register(newServiceBusCmd) }

func newServiceBusCmd(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "servicebus",
		Short: "Operator helpers for Service Bus delivery",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newEnsureSubscriptionCmd(f))
	return cmd
}

// ensureSubOptions are the options of `aq servicebus ensure-subscription`.
type ensureSubOptions struct {
	Topic            string
	Subscription     string
	FactoryID        string
	Pool             string
	RuleName         string
	LockDuration     time.Duration
	MaxDeliveryCount int32
	JSON             bool
	// Sessions (AQ_SB_SESSIONS, --sb-sessions): the subscription requires
	// sessions (RequiresSession), fixed when it is created.
	Sessions bool

	// admin builds the administration client; tests point it at a fake.
	admin func() (*admin.Client, error)
}

// RuleProperty is the application property the subscription rule matches.
const RuleProperty = dispatch.PropTargetFactoryID

func newEnsureSubscriptionCmd(f *Factory) *cobra.Command {
	opts := &ensureSubOptions{}
	cmd := &cobra.Command{
		Use:   "ensure-subscription",
		Short: "Create this factory's subscription and its routing rule, idempotently",
		Long: `Make sure this factory's Service Bus subscription exists on the dispatch
topic with exactly one rule: the correlation filter targetFactoryId = '<factoryId>'
(docs/servicebus.md). Safe to run again and again:

  - a missing subscription is created with that rule as its default rule (so
    no catch-all $Default rule ever exists on it);
  - a rule of that name with another filter is corrected;
  - every other rule is deleted — rules are OR'ed, so $Default (TrueFilter)
    or any extra rule would deliver other factories' jobs here.

Topic, subscription and factory id default to AQ_SB_TOPIC, AQ_SB_SUBSCRIPTION
and AQ_FACTORY_ID. For a pool of replicas (AQ_FACTORY_POOL, or --pool P) the
subscription is the pool's and its rule matches targetFactoryId = '<pool>':
one subscription per pool, which a scaler watches (docs/ondemand.md).

With sessions (AQ_SB_SESSIONS=1 or --sb-sessions) a new subscription is
created with RequiresSession, so the broker hands each repo's messages to one
receiver at a time (docs/servicebus.md). Service Bus cannot turn sessions on
or off on an existing subscription: when the one found disagrees, nothing is
changed and the command fails, saying so. Authentication: AQ_SB_NAMESPACE with the Azure identity of
whoever runs this (DefaultAzureCredential: az login, managed identity; it
needs Manage rights on the namespace), or AQ_SB_CONNECTION_STRING (a
connection string with Manage rights). The topic must exist.

--json prints {topic, subscription, factoryId, rule, filter, requiresSession, created, actions[]}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.Config()
			if err != nil {
				return err
			}
			if err := opts.defaults(cfg); err != nil {
				return err
			}
			if opts.admin == nil {
				opts.admin = func() (*admin.Client, error) {
					return newAdminClient(cfg.SBNamespace, cfg.SBConnectionString, nil, nil)
				}
			}
			return runEnsureSubscription(cmd.Context(), f.IO.Out, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Topic, "topic", "", "dispatch topic (default: AQ_SB_TOPIC)")
	fl.StringVar(&opts.Subscription, "subscription", "", "subscription name (default: AQ_SB_SUBSCRIPTION, i.e. the factory id)")
	fl.StringVar(&opts.FactoryID, "target-factory-id", "", "the factory id the rule matches (default: AQ_FACTORY_ID)")
	fl.StringVar(&opts.Pool, "pool", "", "a pool's subscription: named for the pool, its rule matching targetFactoryId = the pool (default: AQ_FACTORY_POOL)")
	fl.StringVar(&opts.RuleName, "rule", "targetFactoryId", "name of the routing rule")
	fl.DurationVar(&opts.LockDuration, "lock-duration", time.Minute, "message lock duration of a new subscription (aq completes on claim, so this only covers the accept call)")
	fl.Int32Var(&opts.MaxDeliveryCount, "max-delivery-count", 10, "deliveries before the broker dead-letters a message, for a new subscription")
	fl.BoolVar(&opts.JSON, "json", false, "print the result as JSON")
	return configFlags(cmd, config.GroupFleet, config.GroupBroker)
}

// defaults fills what the flags left out from the configuration: topic,
// subscription and target factory id; for a pool (--pool, AQ_FACTORY_POOL)
// the subscription and the target are the pool's.
func (opts *ensureSubOptions) defaults(cfg *config.Config) error {
	if opts.Topic == "" {
		opts.Topic = cfg.SBTopic
	}
	opts.Sessions = cfg.SBSessions
	if opts.Pool == "" {
		opts.Pool = cfg.FactoryPool
	}
	if opts.Pool != "" && !config.ValidID(opts.Pool) {
		return aqerr.Usagef("use letters, digits, '.', '_' and '-'", "--pool %q is not a valid pool name", opts.Pool)
	}
	if opts.Pool != "" {
		if opts.FactoryID != "" && opts.FactoryID != opts.Pool {
			return aqerr.Usagef("drop --target-factory-id: a pool's rule matches the pool", "--pool %s and --target-factory-id %s disagree", opts.Pool, opts.FactoryID)
		}
		opts.FactoryID = opts.Pool
		if opts.Subscription == "" && (cfg.SBSubscription == cfg.FactoryID || cfg.SBSubscription == cfg.FactoryPool) {
			opts.Subscription = opts.Pool
		}
	}
	if opts.Subscription == "" {
		opts.Subscription = cfg.SBSubscription
		if opts.FactoryID != "" && cfg.SBSubscription == cfg.FactoryID {
			opts.Subscription = opts.FactoryID // the subscription follows the factory id unless set
		}
	}
	if opts.FactoryID == "" {
		opts.FactoryID = cfg.FactoryID
	}
	return nil
}

// newAdminClient builds the ATOM administration client: a token credential
// for a namespace (DefaultAzureCredential when cred is nil), else a
// connection string. transport is for tests.
func newAdminClient(namespace, connStr string, cred azcore.TokenCredential, transport policy.Transporter) (*admin.Client, error) {
	opts := &admin.ClientOptions{}
	opts.Transport = transport
	switch {
	case namespace != "":
		if cred == nil {
			c, err := azidentity.NewDefaultAzureCredential(nil)
			if err != nil {
				return nil, aqerr.Wrap(aqerr.Usage, err, "no Azure credential for AQ_SB_NAMESPACE", "run 'az login', or run this where a managed identity is available")
			}
			cred = c
		}
		return admin.NewClient(namespace, cred, opts)
	case connStr != "":
		c, err := admin.NewClientFromConnectionString(connStr, opts)
		if err != nil {
			return nil, aqerr.Usagef("check AQ_SB_CONNECTION_STRING", "AQ_SB_CONNECTION_STRING is not a valid Service Bus connection string")
		}
		return c, nil
	}
	return nil, aqerr.Usagef("set AQ_SB_NAMESPACE (or AQ_SB_CONNECTION_STRING)", "no Service Bus namespace configured")
}

// ensureSubResult is the --json form.
type ensureSubResult struct {
	Topic        string            `json:"topic"`
	Subscription string            `json:"subscription"`
	FactoryID    string            `json:"factoryId"`
	Rule         string            `json:"rule"`
	Filter       map[string]string `json:"filter"`
	// RequiresSession: the subscription requires sessions (AQ_SB_SESSIONS).
	RequiresSession bool     `json:"requiresSession"`
	Created         bool     `json:"created"`
	Actions         []string `json:"actions"` // empty when nothing had to change
}

func runEnsureSubscription(ctx context.Context, out io.Writer, opts *ensureSubOptions) error {
	switch {
	case opts.Topic == "" || opts.Subscription == "" || opts.FactoryID == "":
		return aqerr.Usagef("set AQ_SB_TOPIC, AQ_SB_SUBSCRIPTION and AQ_FACTORY_ID, or pass --topic, --subscription, --target-factory-id",
			"topic, subscription and factory id are all needed")
	case opts.RuleName == "":
		return aqerr.Usagef("pass --rule NAME", "--rule must not be empty")
	}
	ac, err := opts.admin()
	if err != nil {
		return err
	}
	res := ensureSubResult{
		Topic: opts.Topic, Subscription: opts.Subscription, FactoryID: opts.FactoryID, Rule: opts.RuleName,
		Filter: map[string]string{RuleProperty: opts.FactoryID}, RequiresSession: opts.Sessions, Actions: []string{},
	}
	want := admin.RuleProperties{
		Name:   opts.RuleName,
		Filter: &admin.CorrelationFilter{ApplicationProperties: map[string]any{RuleProperty: opts.FactoryID}},
	}
	where := opts.Topic + "/" + opts.Subscription
	sub, err := ac.GetSubscription(ctx, opts.Topic, opts.Subscription, nil)
	if err != nil {
		return adminErr(err, "read subscription "+where)
	}
	if sub != nil {
		if has := sub.RequiresSession != nil && *sub.RequiresSession; has != opts.Sessions {
			return sessionsMismatch(where, has)
		}
	}
	if sub == nil {
		lock := isoDuration(opts.LockDuration)
		props := &admin.SubscriptionProperties{DefaultRule: &want, LockDuration: &lock, MaxDeliveryCount: &opts.MaxDeliveryCount}
		with := ""
		if opts.Sessions {
			props.RequiresSession = &opts.Sessions
			with = " and sessions"
		}
		_, err := ac.CreateSubscription(ctx, opts.Topic, opts.Subscription, &admin.CreateSubscriptionOptions{Properties: props})
		if err != nil {
			return adminErr(err, "create subscription "+where)
		}
		res.Created = true
		res.Actions = append(res.Actions, "created subscription "+where+" with rule "+opts.RuleName+with)
	}
	// Whether just created or found: converge its rules on exactly `want`.
	found := false
	pager := ac.NewListRulesPager(opts.Topic, opts.Subscription, nil)
	var rules []admin.RuleProperties
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return adminErr(err, "list the rules of "+where)
		}
		rules = append(rules, page.Rules...)
	}
	for _, r := range rules {
		switch {
		case r.Name == opts.RuleName && ruleMatches(r, opts.FactoryID):
			found = true
		case r.Name == opts.RuleName:
			if _, err := ac.UpdateRule(ctx, opts.Topic, opts.Subscription, want); err != nil {
				return adminErr(err, "correct rule "+r.Name+" of "+where)
			}
			found = true
			res.Actions = append(res.Actions, "corrected rule "+r.Name+" to "+RuleProperty+" = '"+opts.FactoryID+"'")
		default:
			if _, err := ac.DeleteRule(ctx, opts.Topic, opts.Subscription, r.Name, nil); err != nil {
				return adminErr(err, "delete rule "+r.Name+" of "+where)
			}
			res.Actions = append(res.Actions, "deleted rule "+r.Name+" (it would route other jobs here)")
		}
	}
	if !found {
		if _, err := ac.CreateRule(ctx, opts.Topic, opts.Subscription, &admin.CreateRuleOptions{Name: &want.Name, Filter: want.Filter}); err != nil {
			return adminErr(err, "create rule "+opts.RuleName+" on "+where)
		}
		res.Actions = append(res.Actions, "created rule "+opts.RuleName+": "+RuleProperty+" = '"+opts.FactoryID+"'")
	}
	if opts.JSON {
		return writeJSON(out, res)
	}
	if len(res.Actions) == 0 {
		fmt.Fprintf(out, "subscription %s is in place: rule %s matches %s = '%s' (nothing changed)\n", where, opts.RuleName, RuleProperty, opts.FactoryID)
		return nil
	}
	for _, a := range res.Actions {
		fmt.Fprintln(out, a)
	}
	return nil
}

// sessionsMismatch is an existing subscription whose RequiresSession (has)
// is not what AQ_SB_SESSIONS asks for: the service fixes it at creation.
func sessionsMismatch(where string, has bool) error {
	if has {
		return aqerr.Usagef("set AQ_SB_SESSIONS=1 (the factories receive with sessions then), or delete the subscription and run this again",
			"subscription %s requires sessions but AQ_SB_SESSIONS is off; Service Bus cannot change that on an existing subscription", where)
	}
	return aqerr.Usagef("delete the subscription and run this again to create it with sessions, or unset AQ_SB_SESSIONS",
		"subscription %s does not require sessions but AQ_SB_SESSIONS=1; Service Bus cannot turn sessions on for an existing subscription", where)
}

// ruleMatches reports whether r is exactly the correlation filter
// targetFactoryId = factoryID, with no action.
func ruleMatches(r admin.RuleProperties, factoryID string) bool {
	cf, ok := r.Filter.(*admin.CorrelationFilter)
	if !ok || cf.ContentType != nil || cf.CorrelationID != nil || cf.MessageID != nil || cf.ReplyTo != nil ||
		cf.ReplyToSessionID != nil || cf.SessionID != nil || cf.Subject != nil || cf.To != nil {
		return false
	}
	if _, sql := r.Action.(*admin.SQLAction); sql {
		return false
	}
	keys := slices.Collect(maps.Keys(cf.ApplicationProperties))
	return len(keys) == 1 && keys[0] == RuleProperty && cf.ApplicationProperties[RuleProperty] == factoryID
}

// isoDuration renders d as the ISO 8601 duration the ATOM API takes.
func isoDuration(d time.Duration) string {
	return fmt.Sprintf("PT%dS", int64(d.Seconds()))
}

// adminErr turns an administration failure into a user error.
func adminErr(err error, what string) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		switch re.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return aqerr.Wrap(aqerr.AuthFail, err, fmt.Sprintf("%s: refused (%d)", what, re.StatusCode),
				"the identity needs Manage rights on the namespace")
		case http.StatusNotFound:
			return aqerr.Wrap(aqerr.Failed, err, what+": not found", "create the topic first (AQ_SB_TOPIC)")
		}
		return aqerr.Wrap(aqerr.Failed, err, fmt.Sprintf("%s: the service answered %d %s", what, re.StatusCode, re.ErrorCode), "")
	}
	return aqerr.Wrap(aqerr.Failed, err, what+": "+err.Error(), "")
}
