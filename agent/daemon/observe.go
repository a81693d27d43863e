package daemon

// Gauges measured on a cadence rather than per scrape: the disk the
// worktrees take, and the broker's depth for this factory's subscription
// (the pool's, for a replica) read from the management API.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aqfleet/aq/agent/dispatch"
)

// diskEvery is the cadence of the worktree disk measure (besides one after
// each job).
const diskEvery = 5 * time.Minute

// diskGauge is aq_worktree_disk_bytes: the apparent size of the files under
// $AQ_HOME/worktrees, measured at start, after each job (Kick) and every
// diskEvery by one goroutine — never by a scrape, since a tree with
// node_modules can hold a hundred thousand files.
type diskGauge struct {
	dir   string
	bytes atomic.Int64
	kick  chan struct{}
}

func newDiskGauge(dir string) *diskGauge { return &diskGauge{dir: dir, kick: make(chan struct{}, 1)} }

func (g *diskGauge) value() float64 { return float64(g.bytes.Load()) }

// Kick asks for a measure now (after a job).
func (g *diskGauge) Kick() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// run measures until ctx ends.
func (g *diskGauge) run(ctx context.Context) {
	t := time.NewTicker(diskEvery)
	defer t.Stop()
	for {
		g.bytes.Store(treeBytes(ctx, g.dir))
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		case <-t.C:
		}
	}
}

// treeBytes sums the sizes of the regular files below dir (symlinks are not
// followed; files that vanish mid-walk — a job's worktree being removed —
// are skipped).
func treeBytes(ctx context.Context, dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return filepath.SkipAll
		}
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += info.Size()
		}
		return nil
	})
	return n
}

// depthReader reads a subscription's runtime properties (the admin client).
type depthReader interface {
	GetSubscriptionRuntimeProperties(ctx context.Context, topic, sub string, o *admin.GetSubscriptionRuntimePropertiesOptions) (*admin.GetSubscriptionRuntimePropertiesResponse, error)
}

var _ depthReader = (*admin.Client)(nil)

// brokerDepth holds the last depth read and exports it as
// aq_broker_subscription_active_messages and
// aq_broker_subscription_dead_letter_messages (labels topic, subscription)
// while it is known: after a failed read the gauges are absent ("unknown"),
// not a stale number.
type brokerDepth struct {
	topic, sub   string
	active, dead *prometheus.Desc

	mu             sync.Mutex
	known          bool
	nActive, nDead int64
}

var _ prometheus.Collector = (*brokerDepth)(nil)

func newBrokerDepth(topic, sub string) *brokerDepth {
	labels := prometheus.Labels{"topic": topic, "subscription": sub}
	return &brokerDepth{
		topic: topic, sub: sub,
		active: prometheus.NewDesc("aq_broker_subscription_active_messages",
			"Active messages in this factory's subscription (the pool's for a replica), locked ones included: dispatched jobs no factory has taken yet — what a scaler reads (read every AQ_BROKER_DEPTH_INTERVAL; absent while unknown).", nil, labels),
		dead: prometheus.NewDesc("aq_broker_subscription_dead_letter_messages",
			"Messages in the subscription's dead-letter queue: malformed or mistargeted dispatches, or ones delivered too often — each needs a person (read every AQ_BROKER_DEPTH_INTERVAL; absent while unknown).", nil, labels),
	}
}

// Describe implements prometheus.Collector.
func (b *brokerDepth) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.active
	ch <- b.dead
}

// Collect implements prometheus.Collector: nothing while the depth is
// unknown.
func (b *brokerDepth) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	known, a, d := b.known, b.nActive, b.nDead
	b.mu.Unlock()
	if !known {
		return
	}
	ch <- prometheus.MustNewConstMetric(b.active, prometheus.GaugeValue, float64(a))
	ch <- prometheus.MustNewConstMetric(b.dead, prometheus.GaugeValue, float64(d))
}

func (b *brokerDepth) set(active, dead int64, known bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.known, b.nActive, b.nDead = known, active, dead
}

// watchDepth reads the subscription's depth every interval until ctx ends.
// A read that fails makes the depth unknown with one warning per outage (a
// credential without Manage rights is named as such); the daemon goes on.
func watchDepth(ctx context.Context, r depthReader, b *brokerDepth, every time.Duration, failed func(), log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	warned := false
	for {
		rctx, cancel := context.WithTimeout(ctx, depthReadTimeout(every))
		rp, err := r.GetSubscriptionRuntimeProperties(rctx, b.topic, b.sub, nil)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && rp != nil:
			b.set(int64(rp.ActiveMessageCount), int64(rp.DeadLetterMessageCount), true)
			if warned {
				log.Info("broker depth known again", "topic", b.topic, "subscription", b.sub)
				warned = false
			}
		default:
			b.set(0, 0, false)
			failed()
			why, fix := depthError(err)
			if !warned {
				log.Warn("cannot read the subscription's depth: the broker depth gauges are unknown until a read succeeds (said once)",
					"topic", b.topic, "subscription", b.sub, "why", why, "fix", fix)
				warned = true
			} else {
				log.Debug("broker depth read failed again", "why", why)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// depthReadTimeout bounds one depth read: the interval, but never less
// than 5 s (a short interval must not turn a slow answer — a busy host, a
// TLS handshake — into a read error) nor more than 30 s. The reads do not
// overlap: a read that outlasts the interval delays the next one.
func depthReadTimeout(every time.Duration) time.Duration {
	return min(max(every, 5*time.Second), 30*time.Second)
}

// depthError says why a depth read failed and what fixes it.
func depthError(err error) (why, fix string) {
	var re *azcore.ResponseError
	switch {
	case err == nil:
		return "the subscription does not exist", "create it (aq servicebus ensure-subscription)"
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		return fmt.Sprintf("refused (%d): reading runtime properties needs Manage rights", re.StatusCode),
			"grant the identity Azure Service Bus Data Owner on the namespace (or a Manage policy to the connection string), or set AQ_BROKER_DEPTH_INTERVAL=0"
	case errors.As(err, &re):
		return fmt.Sprintf("the management API answered %d", re.StatusCode), "check the namespace and the topic"
	}
	return "the management API is unreachable: " + err.Error(), "check the network to the namespace"
}

// newDepthReader builds the admin client for the broker configuration: a
// token credential for a namespace (cred, else DefaultAzureCredential), else
// the connection string. A development connection string (the emulator, the
// local peer) has no management endpoint aq can reach: nil, with why.
func newDepthReader(c dispatch.Config, cred azcore.TokenCredential) (depthReader, string, error) {
	switch {
	case c.Namespace != "":
		if cred == nil {
			dc, err := azidentity.NewDefaultAzureCredential(nil)
			if err != nil {
				return nil, "", fmt.Errorf("no Azure credential for the management API: %w", err)
			}
			cred = dc
		}
		ac, err := admin.NewClient(c.Namespace, cred, nil)
		return ac, "", err
	case c.ConnectionString != "":
		if _, emulator, _ := dispatch.EmulatorEndpoint(c.ConnectionString); emulator {
			return nil, "a development connection string (UseDevelopmentEmulator=true) has no management endpoint aq can read", nil
		}
		ac, err := admin.NewClientFromConnectionString(c.ConnectionString, nil)
		if err != nil {
			return nil, "", errors.New("AQ_SB_CONNECTION_STRING is not a valid Service Bus connection string")
		}
		return ac, "", nil
	}
	return nil, "no broker", nil
}
