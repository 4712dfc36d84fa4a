package idempotency_test

import (
	"database/sql"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cutProxy stands between the tests and the server (TCP in front of the
// server's Unix socket, from the PG* environment) and can cut every
// connection, as a server restart or a network blip does.
type cutProxy struct {
	listener net.Listener
	target   string
	mu       sync.Mutex
	conns    map[net.Conn]bool
	refuse   bool      // new connections are closed at once
	cutAfter chan bool // the next message from the client goes through, then every connection is cut
}

func newCutProxy(t *testing.T) *cutProxy {
	t.Helper()
	host, port := os.Getenv("PGHOST"), os.Getenv("PGPORT")
	if host == "" || port == "" || !filepath.IsAbs(host) {
		t.Skip("the proxy needs PGHOST (a socket folder) and PGPORT")
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{listener: listener, target: filepath.Join(host, ".s.PGSQL."+port),
		conns: map[net.Conn]bool{}, cutAfter: make(chan bool, 1)}
	go p.serve()
	t.Cleanup(func() { listener.Close(); p.cut() })
	return p
}

// db opens a database/sql pool through the proxy.
func (p *cutProxy) db(t *testing.T) *sql.DB {
	addr := p.listener.Addr().(*net.TCPAddr)
	return open(t, fmt.Sprintf("host=127.0.0.1 port=%d sslmode=disable", addr.Port))
}

func (p *cutProxy) serve() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		server, err := net.Dial("unix", p.target)
		if refuse || err != nil {
			client.Close()
			if server != nil {
				server.Close()
			}
			continue
		}
		p.track(client, server)
		muted := new(atomic.Bool) // the server's answers no longer reach the client
		go p.pipe(server, client, false, muted)
		go p.pipe(client, server, true, muted)
	}
}

func (p *cutProxy) track(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		p.conns[c] = true
	}
}

func (p *cutProxy) pipe(from, to net.Conn, fromClient bool, muted *atomic.Bool) {
	buf := make([]byte, 32*1024)
	var messages messageReader
	for {
		n, err := from.Read(buf)
		if n > 0 {
			cutNow := false
			if fromClient && messages.executes(buf[:n]) {
				select {
				case <-p.cutAfter: // the server runs the statement: its answer is lost
					muted.Store(true)
					cutNow = true
				default:
				}
			}
			if !fromClient && muted.Load() {
				continue
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
			if cutNow {
				time.Sleep(300 * time.Millisecond)
				p.cutFor(time.Second)
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				to.Close()
			}
			return
		}
	}
}

// cut closes every connection.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// cutFor cuts every connection and refuses new ones for d.
func (p *cutProxy) cutFor(d time.Duration) {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	p.cut()
	time.AfterFunc(d, func() {
		p.mu.Lock()
		p.refuse = false
		p.mu.Unlock()
	})
}

// cutAfterNextStatement: the next statement a client runs reaches the
// server, then every connection is cut (for 1 s) before its answer comes
// back.
func (p *cutProxy) cutAfterNextStatement() { p.cutAfter <- true }

// messageReader follows the messages a client sends (the startup message,
// then a type byte and a length each) to tell when one has a statement run
// and committed: a whole Query, or the Sync after an Execute.
type messageReader struct {
	started  bool
	header   []byte // of the message being read
	left     int    // bytes of its body still to come
	query    bool   // the message being read is a Query
	executed bool   // an Execute since the last Sync
}

func (m *messageReader) executes(chunk []byte) bool {
	runs := false
	for len(chunk) > 0 {
		if m.left > 0 {
			n := min(m.left, len(chunk))
			m.left -= n
			chunk = chunk[n:]
			if m.left == 0 && m.query {
				runs, m.query = true, false
			}
			continue
		}
		size := 5
		if !m.started {
			size = 4
		}
		n := min(size-len(m.header), len(chunk))
		m.header = append(m.header, chunk[:n]...)
		chunk = chunk[n:]
		if len(m.header) < size {
			break
		}
		length := int(m.header[size-4])<<24 | int(m.header[size-3])<<16 | int(m.header[size-2])<<8 | int(m.header[size-1])
		if m.started {
			switch m.header[0] {
			case 'Q':
				m.query = true
			case 'E':
				m.executed = true
			case 'S':
				runs = runs || m.executed
				m.executed = false
			}
		}
		m.left = length - 4
		m.started = true
		m.header = m.header[:0]
	}
	return runs
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}
