package brokertest

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy forwards connections made to it on 127.0.0.1 to the broker's AMQP
// port. It can hold back what the broker sends on every connection or on one
// (a broker that stops answering while the connection stays up), drop one
// connection, and refuse new ones. Connections are numbered from 0 in the
// order the proxy accepted them. Its methods are safe for concurrent use.
//
// Goroutines: one accept loop, and two copiers per connection; all are
// joined by Close.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu      sync.Mutex
	holdAll chan struct{} // nil unless Hold; closed by Release
	pairs   []*pair
	refused bool // Refuse or Close: connections made from now on are closed at once
}

// pair is one client connection and its connection to the broker.
type pair struct {
	client, server net.Conn
	hold           chan struct{} // nil unless HoldConn; closed by Release
}

// Proxy starts a proxy to b. The caller must call Close.
func (b *Broker) Proxy() (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: fmt.Sprintf("127.0.0.1:%d", b.amqpPort)}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the proxy's AMQP URL, as guest.
func (p *Proxy) URL() string {
	return fmt.Sprintf("amqp://guest:guest@%s/", p.ln.Addr())
}

// Hold makes what the broker sends, on every connection, wait in the proxy
// until Release or Close.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holdAll == nil {
		p.holdAll = make(chan struct{})
	}
}

// HoldConn is Hold for connection i only; it reports whether the proxy has
// accepted that connection.
func (p *Proxy) HoldConn(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i >= len(p.pairs) {
		return false
	}
	if p.pairs[i].hold == nil {
		p.pairs[i].hold = make(chan struct{})
	}
	return true
}

// Conns returns how many connections the proxy has accepted.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// DropConn closes connection i, on both sides, as a network failure would.
func (p *Proxy) DropConn(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i < len(p.pairs) {
		_ = p.pairs[i].client.Close()
		_ = p.pairs[i].server.Close()
	}
}

// Refuse closes every connection made to the proxy from now on, as a
// broker that is down would.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused = true
}

// Release lets what the broker sends through again, on every connection.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holdAll != nil {
		close(p.holdAll)
		p.holdAll = nil
	}
	for _, pr := range p.pairs {
		if pr.hold != nil {
			close(pr.hold)
			pr.hold = nil
		}
	}
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.refused = true
	for _, pr := range p.pairs {
		_ = pr.client.Close()
		_ = pr.server.Close()
	}
	p.mu.Unlock()
	p.Release()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		pr := p.connect(client)
		if pr == nil {
			continue
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(pr.server, pr.client)
			_ = pr.server.Close()
			_ = pr.client.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.copyHeld(pr)
			_ = pr.server.Close()
			_ = pr.client.Close()
		}()
	}
}

// connect dials the broker for client and records the pair, or closes
// client when the proxy refuses connections or the broker is unreachable.
func (p *Proxy) connect(client net.Conn) *pair {
	p.mu.Lock()
	refused := p.refused
	p.mu.Unlock()
	if refused {
		_ = client.Close()
		return nil
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refused {
		_ = client.Close()
		_ = server.Close()
		return nil
	}
	pr := &pair{client: client, server: server}
	p.pairs = append(p.pairs, pr)
	return pr
}

// copyHeld copies from the broker to the client, each write waiting while
// the proxy holds the connection.
func (p *Proxy) copyHeld(pr *pair) {
	buf := make([]byte, 32<<10)
	for {
		n, err := pr.server.Read(buf)
		if n > 0 {
			for {
				p.mu.Lock()
				all, one := p.holdAll, pr.hold
				p.mu.Unlock()
				if all == nil && one == nil {
					break
				}
				if all != nil {
					<-all // Release and Close close it
				}
				if one != nil {
					<-one
				}
			}
			if _, werr := pr.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
