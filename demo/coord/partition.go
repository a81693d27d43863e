package coord

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Partition is a TCP proxy in front of the stub that a test can cut: while
// cut, every open connection is closed and new ones are refused — the
// factory sees the coordinator vanish from the network while the stub (and
// its reaper) keep running. A test double, like the stub.
type Partition struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	hang  bool // while cut: hold new connections open, silent, instead of refusing
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// NewPartition listens on 127.0.0.1 and forwards to target (host:port).
func NewPartition(target string) (*Partition, error) {
	return ListenPartition("127.0.0.1:0", target)
}

// ListenPartition is NewPartition listening on addr (host:port). Never
// cut, it is a plain TCP forwarder.
func ListenPartition(addr, target string) (*Partition, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Partition{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Partition) Addr() string { return p.ln.Addr().String() }

// Cut severs the link: open connections are closed, new ones refused.
func (p *Partition) Cut() { p.set(true, false) }

// Blackhole severs the link the nasty way: open connections are closed and
// new ones are accepted but never answered (a dropped route), until Heal.
func (p *Partition) Blackhole() { p.set(true, true) }

// Heal restores the link (held connections are closed).
func (p *Partition) Heal() { p.set(false, false) }

// set changes the link's state and closes every open connection.
func (p *Partition) set(cut, hang bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.hang = cut, hang
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy and waits for its goroutines.
func (p *Partition) Close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Partition) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		switch {
		case p.cut && p.hang:
			p.conns[c] = true
			p.mu.Unlock()
			p.wg.Add(1)
			go p.hold(c)
			continue
		case p.cut:
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = true
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(c)
	}
}

// hold swallows what c sends until it is closed (Heal, Close).
func (p *Partition) hold(c net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(io.Discard, c)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Partition) pipe(c net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	// A target across a link that is down does not refuse: give up.
	up, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		up.Close()
		return
	}
	p.conns[up] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, up)
		p.mu.Unlock()
		up.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); up.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); c.Close(); done <- struct{}{} }()
	<-done
	<-done
}
