package egress

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// tunnel moves bytes both ways between the client and the upstream
// connection until both directions ended (each half-closed by its
// sender), one failed, or neither moved a byte for IdleTimeout.
//
// Where the kernel keeps account of the upstream connection's last data
// (Linux, a TCP upstream), a watchdog asks it, four times per IdleTimeout,
// how long ago data last moved either way, and the copies need no timing
// of their own. The download from the upstream to a client on the unix
// socket is then spliced (splice(2): the bytes never pass through aq's
// memory); every other direction is copied through a buffer, which
// measured faster on loopback than splicing (docs/BENCHMARKS.md). Without
// the kernel's account, each direction copies through a buffer and times
// itself.
func (p *Proxy) tunnel(client, up net.Conn) {
	if tc, ok := up.(*net.TCPConn); ok {
		if _, ok := sinceData(tc); ok {
			p.watchedTunnel(client, tc)
			return
		}
	}
	var last atomic.Int64 // unix nanos of the last byte moved either way
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pipe(up, client, &last)
	}()
	p.pipe(client, up, &last)
	<-done
}

// watchedTunnel is tunnel with the kernel's account of the upstream
// connection watching for idleness.
func (p *Proxy) watchedTunnel(client net.Conn, up *net.TCPConn) {
	upDone, stop, watchDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(upDone)
		half(up, client, false)
	}()
	go func() {
		defer close(watchDone)
		t := time.NewTicker(max(p.o.IdleTimeout/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if d, ok := sinceData(up); ok && d >= p.o.IdleTimeout {
					client.Close()
					_ = up.Close()
					return
				}
			}
		}
	}()
	_, toUnix := client.(*net.UnixConn)
	half(client, up, toUnix)
	<-upDone
	close(stop)
	<-watchDone
}

// half copies src to dst — spliced by the runtime when splice, else
// through a pooled buffer — then half-closes dst so that its reader sees
// the end; on a failure it closes both, which ends the other direction.
func half(dst, src net.Conn, splice bool) {
	var err error
	if splice {
		_, err = io.Copy(dst, src)
	} else {
		bp := bufPool.Get().(*[]byte)
		// The wrappers hide ReadFrom and WriteTo, which would splice.
		_, err = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *bp)
		bufPool.Put(bp)
	}
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	src.Close()
	dst.Close()
}

// pipe copies src to dst. At src's end it half-closes dst, so that dst's
// reader sees the end too; on a failure it closes both, which ends the
// other direction as well. A read that waited IdleTimeout goes on waiting
// while the other direction is moving bytes.
func (p *Proxy) pipe(dst, src net.Conn, last *atomic.Int64) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	idle := p.o.IdleTimeout
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle))
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				dst.Close()
				return
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, last.Load())) < idle {
			continue // the other way is busy: this one is not idle
		}
		if errors.Is(err, io.EOF) {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				return
			}
		}
		src.Close()
		dst.Close()
		return
	}
}
