package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/internal/aqerr"
)

// atomFake is a Service Bus management endpoint (HTTPS, ATOM/XML) that keeps
// subscriptions and their rules the way the service does: a subscription
// created without a default rule gets the catch-all $Default (TrueFilter).
type atomFake struct {
	mu     sync.Mutex
	topics map[string]bool
	subs   map[string]string     // "topic/sub" → entry
	rules  map[string][]fakeRule // "topic/sub" → rules, in creation order
	calls  []string              // "METHOD path"
	auth   []string              // Authorization headers seen
}

type fakeRule struct{ name, entry string }

const (
	atomNS = `xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance"`
	// The admin client dereferences the rule's Action: a rule entry without
	// one makes it panic, so every rule this fake returns has one.
	emptyAction = `<Action i:type="EmptyRuleAction"/>`
)

var (
	reSub   = regexp.MustCompile(`^/([^/]+)/Subscriptions/([^/]+)$`)
	reRules = regexp.MustCompile(`^/([^/]+)/Subscriptions/([^/]+)/Rules/?$`)
	reRule  = regexp.MustCompile(`^/([^/]+)/Subscriptions/([^/]+)/Rules/([^/]+)$`)
	reDef   = regexp.MustCompile(`(?s)<DefaultRuleDescription>(.*?)</DefaultRuleDescription>`)
	reName  = regexp.MustCompile(`<Name>([^<]*)</Name>`)
	reRD    = regexp.MustCompile(`(?s)<RuleDescription[^>]*>(.*)</RuleDescription>`)
)

func newAtomFake() *atomFake {
	return &atomFake{topics: map[string]bool{"fleet-dispatch": true}, subs: map[string]string{}, rules: map[string][]fakeRule{}}
}

func ruleEntry(inner string) string {
	if !strings.Contains(inner, "<Action") {
		inner = emptyAction + inner
	}
	return `<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><RuleDescription ` + atomNS + `>` + inner + `</RuleDescription></content></entry>`
}

func (f *atomFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	w.Header().Set("Content-Type", "application/atom+xml;type=entry;charset=utf-8")
	notFound := func() {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `<Error><Code>404</Code><Detail>not found</Detail></Error>`)
	}
	if m := reSub.FindStringSubmatch(r.URL.Path); m != nil {
		key := m[1] + "/" + m[2]
		switch r.Method {
		case http.MethodGet:
			if e, ok := f.subs[key]; ok {
				fmt.Fprint(w, e)
				return
			}
			notFound()
		case http.MethodPut:
			if !f.topics[m[1]] {
				notFound()
				return
			}
			f.subs[key] = string(body)
			if d := reDef.FindStringSubmatch(string(body)); d != nil {
				name := reName.FindStringSubmatch(d[1])[1]
				f.rules[key] = []fakeRule{{name, ruleEntry(d[1])}}
			} else {
				f.rules[key] = []fakeRule{{"$Default", ruleEntry(`<Filter i:type="TrueFilter"><SqlExpression>1=1</SqlExpression></Filter><Name>$Default</Name>`)}}
			}
			w.WriteHeader(http.StatusCreated)
			w.Write(body)
		}
		return
	}
	if m := reRules.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodGet {
		rules := f.rules[m[1]+"/"+m[2]]
		skip, _ := strconv.Atoi(r.URL.Query().Get("$skip"))
		var b strings.Builder
		b.WriteString(`<feed xmlns="http://www.w3.org/2005/Atom"><title type="text">Rules</title>`)
		for i := skip; i < len(rules); i++ {
			b.WriteString(rules[i].entry)
		}
		b.WriteString(`</feed>`)
		w.Header().Set("Content-Type", "application/atom+xml;type=feed;charset=utf-8")
		fmt.Fprint(w, b.String())
		return
	}
	if m := reRule.FindStringSubmatch(r.URL.Path); m != nil {
		key, name := m[1]+"/"+m[2], m[3]
		if _, ok := f.subs[key]; !ok {
			notFound()
			return
		}
		rules := f.rules[key]
		idx := -1
		for i, x := range rules {
			if x.name == name {
				idx = i
			}
		}
		switch r.Method {
		case http.MethodPut:
			inner := reRD.FindStringSubmatch(string(body))[1]
			e := ruleEntry(inner)
			status := http.StatusCreated
			if idx >= 0 {
				rules[idx].entry = e
				status = http.StatusOK
			} else {
				f.rules[key] = append(rules, fakeRule{name, e})
			}
			w.WriteHeader(status)
			fmt.Fprint(w, e)
		case http.MethodDelete:
			if idx < 0 {
				notFound()
				return
			}
			f.rules[key] = append(rules[:idx], rules[idx+1:]...)
			w.WriteHeader(http.StatusOK)
		case http.MethodGet:
			if idx < 0 {
				notFound()
				return
			}
			fmt.Fprint(w, rules[idx].entry)
		}
		return
	}
	http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
}

func (f *atomFake) ruleNames(key string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.rules[key] {
		out = append(out, r.name)
	}
	return out
}

func (f *atomFake) writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if !strings.HasPrefix(c, "GET ") {
			n++
		}
	}
	return n
}

type fakeTokenCred struct{}

func (fakeTokenCred) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "admin-jwt", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

func startAtomFake(t *testing.T) (*atomFake, *httptest.Server) {
	f := newAtomFake()
	srv := httptest.NewTLSServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func ensureOpts(srv *httptest.Server, factory string, viaConnStr bool) *ensureSubOptions {
	host := strings.TrimPrefix(srv.URL, "https://")
	return &ensureSubOptions{
		Topic: "fleet-dispatch", Subscription: factory, FactoryID: factory, RuleName: "targetFactoryId",
		LockDuration: time.Minute, MaxDeliveryCount: 10, JSON: true,
		admin: func() (*admin.Client, error) {
			if viaConnStr {
				return newAdminClient("", "Endpoint=sb://"+host+"/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0", nil, srv.Client())
			}
			return newAdminClient(host, "", fakeTokenCred{}, srv.Client())
		},
	}
}

func runEnsure(t *testing.T, opts *ensureSubOptions) ensureSubResult {
	t.Helper()
	var out bytes.Buffer
	if err := runEnsureSubscription(context.Background(), &out, opts); err != nil {
		t.Fatalf("ensure-subscription: %v", err)
	}
	var res ensureSubResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("--json output %q: %v", out.String(), err)
	}
	return res
}

// First run creates the subscription with the routing rule as its default
// rule (no $Default catch-all); the second run changes nothing.
func TestEnsureSubscriptionCreatesThenIsIdempotent(t *testing.T) {
	for _, viaConnStr := range []bool{false, true} {
		t.Run(fmt.Sprintf("connstr=%v", viaConnStr), func(t *testing.T) {
			f, srv := startAtomFake(t)
			res := runEnsure(t, ensureOpts(srv, "fa", viaConnStr))
			if !res.Created || len(res.Actions) != 1 || res.Filter["targetFactoryId"] != "fa" {
				t.Fatalf("first run: %+v", res)
			}
			if got := f.ruleNames("fleet-dispatch/fa"); len(got) != 1 || got[0] != "targetFactoryId" {
				t.Fatalf("rules after create: %v", got)
			}
			f.mu.Lock()
			subXML := f.subs["fleet-dispatch/fa"]
			auth := f.auth[0]
			f.mu.Unlock()
			for _, want := range []string{`type="CorrelationFilter"`, "<Key>targetFactoryId</Key>", ">fa</Value>", "<LockDuration>PT60S</LockDuration>", "<MaxDeliveryCount>10</MaxDeliveryCount>"} {
				if !strings.Contains(subXML, want) {
					t.Fatalf("subscription PUT lacks %s:\n%s", want, subXML)
				}
			}
			// the credential's token as it is, or a SAS signed with the key
			wantAuth := "admin-jwt"
			if viaConnStr {
				wantAuth = "SharedAccessSignature "
			}
			if !strings.Contains(auth, wantAuth) {
				t.Fatalf("Authorization %q, want %q", auth, wantAuth)
			}
			writes := f.writes()
			res = runEnsure(t, ensureOpts(srv, "fa", viaConnStr))
			if res.Created || len(res.Actions) != 0 || f.writes() != writes {
				t.Fatalf("second run changed something: %+v (writes %d → %d)", res, writes, f.writes())
			}
		})
	}
}

// A subscription made by hand (with the service's $Default TrueFilter, and a
// rule of our name pointing at the wrong factory) is converged: $Default
// deleted, the rule corrected; then nothing more to do.
func TestEnsureSubscriptionRepairsRules(t *testing.T) {
	f, srv := startAtomFake(t)
	ac, err := ensureOpts(srv, "fa", false).admin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := ac.CreateSubscription(ctx, "fleet-dispatch", "fa", nil); err != nil {
		t.Fatal(err)
	}
	name := "targetFactoryId"
	if _, err := ac.CreateRule(ctx, "fleet-dispatch", "fa", &admin.CreateRuleOptions{Name: &name,
		Filter: &admin.CorrelationFilter{ApplicationProperties: map[string]any{"targetFactoryId": "fb"}}}); err != nil {
		t.Fatal(err)
	}
	res := runEnsure(t, ensureOpts(srv, "fa", false))
	if res.Created || len(res.Actions) != 2 || !strings.Contains(strings.Join(res.Actions, "\n"), "deleted rule $Default") {
		t.Fatalf("repair: %+v", res)
	}
	if got := f.ruleNames("fleet-dispatch/fa"); len(got) != 1 || got[0] != "targetFactoryId" {
		t.Fatalf("rules after repair: %v", got)
	}
	f.mu.Lock()
	entry := f.rules["fleet-dispatch/fa"][0].entry
	f.mu.Unlock()
	if !strings.Contains(entry, ">fa</Value>") || strings.Contains(entry, ">fb</Value>") {
		t.Fatalf("rule not corrected:\n%s", entry)
	}
	if res := runEnsure(t, ensureOpts(srv, "fa", false)); len(res.Actions) != 0 {
		t.Fatalf("after repair: %+v", res)
	}
}

// A missing topic is a clear error; missing settings are usage errors.
func TestEnsureSubscriptionErrors(t *testing.T) {
	_, srv := startAtomFake(t)
	o := ensureOpts(srv, "fa", false)
	o.Topic = "no-such-topic"
	err := runEnsureSubscription(context.Background(), io.Discard, o)
	if err == nil || !strings.Contains(err.Error(), "create the topic first") {
		t.Fatalf("missing topic: %v", err)
	}
	o = ensureOpts(srv, "", false)
	if err := runEnsureSubscription(context.Background(), io.Discard, o); aqerr.ExitCode(err) != aqerr.Usage {
		t.Fatalf("no factory id: %v (code %d)", err, aqerr.ExitCode(err))
	}
	if _, err := newAdminClient("", "", nil, nil); aqerr.ExitCode(err) != aqerr.Usage {
		t.Fatalf("nothing configured: %v", err)
	}
	if _, err := newAdminClient("", "garbage-with-SharedAccessKey=topsecret", nil, nil); err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("bad connection string: %v", err)
	}
}

// A pool's subscription is named for the pool and its rule matches the pool
// (one subscription per pool, which the scaler watches); a factory's is its
// own. Flags win over the configuration; a pool and another target disagree.
func TestEnsureSubscriptionPoolDefaults(t *testing.T) {
	for _, c := range []struct {
		name              string
		cfg               config.Config
		flags             ensureSubOptions
		wantSub, wantRule string
		wantErr           string
	}{
		{"factory", config.Config{FactoryID: "fa", SBSubscription: "fa", SBTopic: "t"}, ensureSubOptions{}, "fa", "fa", ""},
		{"pool from the configuration", config.Config{FactoryID: "pod-7", FactoryPool: "builders", SBSubscription: "builders", SBTopic: "t"}, ensureSubOptions{}, "builders", "builders", ""},
		{"--pool", config.Config{FactoryID: "fa", SBSubscription: "fa", SBTopic: "t"}, ensureSubOptions{Pool: "builders"}, "builders", "builders", ""},
		{"--pool with its own subscription name", config.Config{FactoryID: "fa", SBSubscription: "fa", SBTopic: "t"}, ensureSubOptions{Pool: "builders", Subscription: "b-sub"}, "b-sub", "builders", ""},
		{"--pool and another target", config.Config{FactoryID: "fa", SBSubscription: "fa", SBTopic: "t"}, ensureSubOptions{Pool: "builders", FactoryID: "fb"}, "", "", "disagree"},
		{"--pool not an id", config.Config{FactoryID: "fa", SBSubscription: "fa", SBTopic: "t"}, ensureSubOptions{Pool: "a b"}, "", "", "not a valid pool name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.flags
			err := o.defaults(&c.cfg)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || aqerr.ExitCode(err) != aqerr.Usage {
					t.Fatalf("err %v, want a usage error with %q", err, c.wantErr)
				}
				return
			}
			if err != nil || o.Subscription != c.wantSub || o.FactoryID != c.wantRule || o.Topic != "t" {
				t.Fatalf("subscription %q rule %q topic %q err %v; want %q, %q", o.Subscription, o.FactoryID, o.Topic, err, c.wantSub, c.wantRule)
			}
		})
	}
}
