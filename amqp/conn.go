package amqp

import (
	"context"
	"fmt"
	"maps"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/guard"
)

// errEngineStopped is what waits for a connection return once the engine
// has closed its connections for good.
var errEngineStopped = fmt.Errorf("%w: the engine has shut down", tinymq.ErrStopped)

// ensureRunning starts the supervisor on first use: the engine connects
// lazily, at the first declaration, publish or Start, and never from Init.
func (e *engine) ensureRunning() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running || e.closing {
		return
	}
	e.running = true
	e.supWG.Add(1)
	go e.supervise()
}

// supervise is the supervisor goroutine: it connects, re-declares the
// topology, publishes the connections for publishers and consumers, waits
// until one is lost, and starts again after a backoff with jitter, until quit
// is closed. Started by ensureRunning; joined by finish (supWG).
func (e *engine) supervise() {
	defer e.supWG.Done()
	defer e.own.Leave(e.own.Enter()) // it logs: the logger may call Stop
	// failed counts the attempts since the last connection that came up.
	failed := 0
	for {
		connected, err := e.session()
		select {
		case <-e.quit:
			return
		default:
		}
		if connected {
			failed = 0
		}
		failed++
		e.mu.Lock()
		e.lastErr = err
		e.mu.Unlock()
		wait := e.cfg.reconnect.Wait(failed)
		e.logWarn("tinymq/amqp: no connection to the broker; reconnecting",
			"err", guard.ErrorText(err), "backoff", wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-e.quit:
			t.Stop()
			return
		}
	}
}

// session runs one pair of connections (publishing, consuming) until one of
// them is lost or quit is closed. connected says whether both were up.
func (e *engine) session() (connected bool, err error) {
	url, pubConn, err := e.dialNode("publish")
	if err != nil {
		return false, err
	}
	defer closeConn(pubConn)
	subConn, err := e.dial(url, "consume")
	if err != nil {
		return false, err
	}
	defer closeConn(subConn)
	pubClosed := pubConn.NotifyClose(make(chan *amqp091.Error, 1))
	subClosed := subConn.NotifyClose(make(chan *amqp091.Error, 1))
	// The library sends on it from its reader, which must not wait for the
	// loop below (busy declaring, say): buffered for many more than the
	// alternating blocks and unblocks a connection gets meanwhile.
	blocks := pubConn.NotifyBlocked(make(chan amqp091.Blocking, 16))
	defer e.clearBlocked() // a new connection starts unblocked

	e.topoMu.Lock()
	e.gen++
	gen := e.gen
	steps := append([]step(nil), e.steps...)
	e.topoMu.Unlock()
	if err := e.redeclare(pubConn, steps); err != nil {
		return false, err
	}
	s, err := e.openPub(pubConn)
	if err != nil {
		return false, err
	}
	subLost := make(chan struct{})
	e.mu.Lock()
	e.pub, e.pubConn, e.connGen = s, pubConn, gen
	e.sub, e.subLost = subConn, subLost
	e.lastErr = nil
	e.signalLocked()
	e.mu.Unlock()
	e.logInfo("tinymq/amqp: connected to the broker", "node", nodeAddr(url))

	defer func() {
		e.mu.Lock()
		e.pub, e.pubConn, e.sub, e.subLost = nil, nil, nil, nil
		close(subLost)
		e.signalLocked()
		e.mu.Unlock()
		// Closing the connection closes the channel; its confirm loop then
		// hands every unconfirmed publish back to be sent again.
		closeConn(pubConn)
		<-s.closed
	}()
	for {
		select {
		case aerr := <-pubClosed:
			return true, connError("publishing connection", aerr)
		case aerr := <-subClosed:
			return true, connError("consuming connection", aerr)
		case <-s.closed:
			// The publishing channel closed but not its connection (the broker
			// refused something): open another one.
			e.mu.Lock()
			e.pub = nil
			e.signalLocked()
			e.mu.Unlock()
			// The usual cause is a publish to an exchange deleted behind our
			// back: declare everything again before sending it again.
			e.logWarn("tinymq/amqp: the publishing channel closed; declaring the topology and opening another")
			e.topoMu.RLock()
			steps := append([]step(nil), e.steps...)
			e.topoMu.RUnlock()
			if err := e.redeclare(pubConn, steps); err != nil {
				return true, err
			}
			ns, err := e.openPub(pubConn)
			if err != nil {
				return true, err // s is closed: the deferred teardown does not wait
			}
			s = ns
			e.mu.Lock()
			e.pub = s
			e.signalLocked()
			e.mu.Unlock()
		case b, ok := <-blocks:
			if ok {
				e.setBlocked(b)
			} else {
				blocks = nil // closed with the connection: pubClosed says why
			}
		case <-e.quit:
			return true, nil
		}
	}
}

// setBlocked notes the broker's connection.blocked (b.Active, with its
// reason) or connection.unblocked on the publishing connection, for Stats and
// for the error of a Publish that waited behind it, and logs the change: a
// warning when blocked (publishes wait, at most their timeout), info when
// unblocked.
func (e *engine) setBlocked(b amqp091.Blocking) {
	reason := ""
	if b.Active {
		reason = b.Reason
		if reason == "" {
			reason = "blocked"
		}
	}
	e.mu.Lock()
	was := e.blocked
	e.blocked = reason
	e.mu.Unlock()
	switch {
	case reason != "" && was == "":
		e.logWarn("tinymq/amqp: the broker blocked the publishing connection (a resource alarm); publishes wait until it unblocks, at most their timeout",
			"reason", reason)
	case reason == "" && was != "":
		e.logInfo("tinymq/amqp: the broker unblocked the publishing connection", "reason_was", was)
	}
}

// clearBlocked forgets the block of a connection that is gone, without a
// line: the reconnect is logged.
func (e *engine) clearBlocked() {
	e.mu.Lock()
	e.blocked = ""
	e.mu.Unlock()
}

// blockedNote says, for the error of a Publish that ended unconfirmed,
// that the broker blocks publishes, if it does.
func (e *engine) blockedNote() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.blocked == "" {
		return ""
	}
	return fmt.Sprintf(" (the broker blocks this MQ's publishes: %s)", e.blocked)
}

// closeTimeout bounds the close handshake of a connection: a broker that
// holds back its close-ok (overloaded, or cut off) must not hold a Stop.
const closeTimeout = 2 * time.Second

// closeConn closes conn, waiting at most closeTimeout for the broker. Its
// channels close with it, whatever the broker says.
func closeConn(conn *amqp091.Connection) {
	_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
}

func connError(what string, aerr *amqp091.Error) error {
	if aerr == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s lost: %w", what, aerr)
}

// dial opens one connection to url with the configured client settings.
func (e *engine) dial(url, purpose string) (*amqp091.Connection, error) {
	cfg := e.cfg.amqp
	cfg.Properties = maps.Clone(cfg.Properties)
	if cfg.Properties == nil {
		cfg.Properties = amqp091.NewConnectionProperties()
	}
	if _, ok := cfg.Properties["connection_name"]; !ok {
		cfg.Properties["connection_name"] = "tinymq " + purpose
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Locale == "" {
		cfg.Locale = "en_US"
	}
	if cfg.Dial == nil {
		cfg.Dial = amqp091.DefaultDial(10 * time.Second)
	}
	return amqp091.DialConfig(url, cfg)
}

// signalLocked wakes everyone waiting for the connection state to change.
// The caller holds mu.
func (e *engine) signalLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// waitConn waits for a publishing connection of another generation than
// skip (0: any) and returns it with its generation. It fails when ctx ends
// or the engine has shut down.
func (e *engine) waitConn(ctx context.Context, skip uint64) (*amqp091.Connection, uint64, error) {
	for {
		e.mu.Lock()
		conn, gen, changed, lastErr := e.pubConn, e.connGen, e.changed, e.lastErr
		e.mu.Unlock()
		if conn != nil && gen != skip {
			return conn, gen, nil
		}
		select {
		case <-changed:
		case <-e.stop: // the MQ lets no declaration begin after Shutdown did
			return nil, 0, errEngineStopped
		case <-ctx.Done():
			return nil, 0, noConnection(lastErr, ctx.Err())
		}
	}
}

// waitPub waits for a publishing session. Once the consumers have finished
// at a Shutdown (draining), no publish waits for one any more: the engine is
// about to close its connections. Past a Shutdown deadline, none sends.
func (e *engine) waitPub(ctx context.Context) (*pubSession, error) {
	for {
		e.mu.Lock()
		s, changed, lastErr := e.pub, e.changed, e.lastErr
		e.mu.Unlock()
		select {
		case <-e.abort:
			return nil, errEngineStopped
		default:
		}
		if s != nil {
			return s, nil
		}
		select {
		case <-changed:
		case <-e.draining:
			return nil, errEngineStopped
		case <-e.abort:
			return nil, errEngineStopped
		case <-ctx.Done():
			return nil, noConnection(lastErr, ctx.Err())
		}
	}
}

// waitSub waits for the consuming connection; ok is false once stop or
// quit is closed.
func (e *engine) waitSub(quit <-chan struct{}) (conn *amqp091.Connection, lost <-chan struct{}, ok bool) {
	for {
		select {
		case <-e.stop:
			return nil, nil, false
		case <-quit:
			return nil, nil, false
		default:
		}
		e.mu.Lock()
		conn, lost, changed := e.sub, e.subLost, e.changed
		e.mu.Unlock()
		if conn != nil {
			return conn, lost, true
		}
		select {
		case <-changed:
		case <-e.stop:
			return nil, nil, false
		case <-quit:
			return nil, nil, false
		}
	}
}

func noConnection(lastErr, ctxErr error) error {
	if lastErr == nil {
		return fmt.Errorf("no connection to the broker yet: %w", ctxErr)
	}
	return fmt.Errorf("no connection to the broker (%v): %w", lastErr, ctxErr)
}
