package cli

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/internal/version"
)

// observe is what a command that runs jobs reports through: the job traces
// (OTEL_* variables) and the notifications (AQ_NOTIFY_URL). Built once, by
// the commands that run jobs (aq run, aq daemon), and closed when the
// command returns (Factory.closeObserve): buffered spans are exported and
// queued notifications delivered, each within a time limit.
type observe struct {
	tracing  *telemetry.Tracing
	notifier *notify.Notifier
}

// closeLimit bounds how long aq's exit waits on a collector or a webhook
// receiver that does not answer.
const closeLimit = 5 * time.Second

type observeState struct {
	once sync.Once
	o    *observe
	err  error
}

// observed builds the command's tracing and notifier. A bad OTEL_* value, or
// AQ_CLAUDE_TELEMETRY without an endpoint, is a usage error (exit 2).
func (f *Factory) observed() (*observe, error) {
	f.obs.once.Do(func() {
		cfg, err := f.Config()
		if err != nil {
			f.obs.err = err
			return
		}
		log := f.Logger()
		if cfg.ClaudeTelemetry {
			if err := telemetry.CheckClaude(nil); err != nil {
				f.obs.err = err
				return
			}
		}
		tr, err := telemetry.Setup(context.Background(), telemetry.Options{Log: log, Version: version.Get().Version, FactoryID: cfg.FactoryID})
		if err != nil {
			f.obs.err = err
			return
		}
		if tr.Enabled() {
			// The SDK's own errors (rare: export errors are handled by aq)
			// go to aq's log, not to a logger of the SDK's.
			otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Debug("opentelemetry", "err", err) }))
		}
		n := notify.Start(context.Background(), notify.Options{URL: cfg.NotifyURL, Factory: cfg.FactoryID, Log: log, Redactor: f.Redactor()})
		if n != nil {
			log.Info("notifications on: a JSON POST when a job ships, fails for good or needs a person")
		}
		f.obs.o = &observe{tracing: tr, notifier: n}
	})
	return f.obs.o, f.obs.err
}

// Tracer is the jobs' tracer (a no-op one when tracing is off).
func (o *observe) Tracer() trace.Tracer { return o.tracing.Tracer() }

// closeObserve exports what the command's tracing buffered and delivers its
// queued notifications, each within closeLimit.
func (f *Factory) closeObserve() {
	o := f.obs.o
	if o == nil {
		return
	}
	o.notifier.Close(closeLimit)
	ctx, cancel := context.WithTimeout(context.Background(), closeLimit)
	defer cancel()
	if err := o.tracing.Shutdown(ctx); err != nil {
		f.Logger().Warn("not every span of this run could be exported", "err", err)
	}
}
