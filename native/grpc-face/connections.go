package main

import (
	"net"
	"sync"
	"sync/atomic"
)

// cappedListener closes a new connection at once, unread, while maxOpen of its connections are open: what
// gRPC's core does past grpc.max_allowed_incoming_connections on the Python server's port
// (grpcgrade.service.options.public_server_options). golang.org/x/net/netutil's LimitListener instead stops
// accepting, so the connections past the limit would wait in the backlog, and then in the client's connect.
type cappedListener struct {
	net.Listener
	maxOpen int64
	open    int64
}

func capConnections(l net.Listener, maxOpen int) net.Listener {
	return &cappedListener{Listener: l, maxOpen: int64(maxOpen)}
}

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if atomic.AddInt64(&l.open, 1) > l.maxOpen {
			atomic.AddInt64(&l.open, -1)
			conn.Close()
			continue
		}
		return &countedConn{Conn: conn, open: &l.open}, nil
	}
}

// countedConn gives its place back once, however many times it is closed.
type countedConn struct {
	net.Conn
	open *int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { atomic.AddInt64(c.open, -1) })
	return c.Conn.Close()
}
