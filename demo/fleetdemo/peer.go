package fleetdemo

import (
	"time"

	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
)

// startPeer runs the local AMQP 1.0 stand-in for Azure Service Bus
// (demo/sbpeer) with one subscription per factory on topic, each with the
// correlation rule targetFactoryId = '<factory>'.
func startPeer(dir, work string, env []string, topic string, factories []string) (*sbpeerproc.Peer, error) {
	node, err := demo.LookPath("node", env)
	if err != nil {
		return nil, err
	}
	opts := sbpeerproc.Options{Dir: work, Node: node, PeerDir: dir, Env: env, LockDuration: 30 * time.Second, MaxDelivery: 10}
	for _, f := range factories {
		opts.Subs = append(opts.Subs, topic+"/"+f)
	}
	return sbpeerproc.Launch(opts)
}
