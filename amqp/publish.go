package amqp

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/guard"
)

// pubSession is one publishing channel in confirm mode. Its confirm loop
// (started by openPub, joined by whoever waits for closed) matches the
// broker's confirms and returns to publishes by delivery tag.
//
// A basic.return always reaches the client before the basic.ack of the same
// message, and the client library hands both over from one reader goroutine.
// The returns channel is unbuffered, so the loop has taken a return before the
// library even queues the ack behind it: when the loop sees the ack, it has
// already noted the return.
type pubSession struct {
	ch     *amqp091.Channel
	closed chan struct{} // closed when the loop has ended: the channel is gone

	mu       sync.Mutex
	pending  map[uint64]*pendingPub // by delivery tag
	early    map[uint64]bool        // confirms that came before their publish was noted: ack
	returned map[string]int         // message IDs returned and not yet confirmed
	dead     bool
}

// pendingPub is one publish waiting for its confirm. Its fields are written
// before done is closed.
type pendingPub struct {
	id       string
	done     chan struct{}
	ack      bool // the broker took it (false: nack)
	returned bool // mandatory and unroutable
	lost     bool // the channel closed first: publish it again
}

// openPub opens a publishing channel in confirm mode and starts its loop.
func (e *engine) openPub(conn *amqp091.Connection) (*pubSession, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	s := &pubSession{
		ch:       ch,
		closed:   make(chan struct{}),
		pending:  make(map[uint64]*pendingPub),
		early:    make(map[uint64]bool),
		returned: make(map[string]int),
	}
	returns := ch.NotifyReturn(make(chan amqp091.Return))
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 256))
	go s.loop(returns, confirms)
	return s, nil
}

// loop runs until the library closes both channels, which it does when the
// AMQP channel closes; then every publish still waiting is marked lost.
func (s *pubSession) loop(returns <-chan amqp091.Return, confirms <-chan amqp091.Confirmation) {
	defer close(s.closed)
	for returns != nil || confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.mu.Lock()
			s.returned[r.MessageId]++
			s.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			s.mu.Lock()
			if p := s.pending[c.DeliveryTag]; p != nil {
				delete(s.pending, c.DeliveryTag)
				s.settleLocked(p, c.Ack)
			} else {
				s.early[c.DeliveryTag] = c.Ack
			}
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	s.dead = true
	for tag, p := range s.pending {
		delete(s.pending, tag)
		p.lost = true
		close(p.done)
	}
	s.mu.Unlock()
}

func (s *pubSession) settleLocked(p *pendingPub, ack bool) {
	p.ack = ack
	if n := s.returned[p.id]; n > 0 {
		p.returned = true
		if n == 1 {
			delete(s.returned, p.id)
		} else {
			s.returned[p.id] = n - 1
		}
	}
	close(p.done)
}

// publish sends msg and returns the publish to wait for. An error means the
// channel is closed or closing.
func (s *pubSession) publish(exchange, key string, msg *amqp091.Publishing) (*pendingPub, error) {
	dc, err := s.ch.PublishWithDeferredConfirm(exchange, key, true, false, *msg)
	if err != nil {
		return nil, err
	}
	p := &pendingPub{id: msg.MessageId, done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ack, ok := s.early[dc.DeliveryTag]; {
	case s.dead:
		p.lost = true
		close(p.done)
	case ok:
		delete(s.early, dc.DeliveryTag)
		s.settleLocked(p, ack)
	default:
		s.pending[dc.DeliveryTag] = p
	}
	return p, nil
}

// publishConfirmed publishes msg with mandatory set and waits for the broker's
// confirm, sending it again on the next connection if the connection is lost
// first, until ctx ends. It returns nil only for a message the broker
// confirmed and routed.
func (e *engine) publishConfirmed(ctx context.Context, exchange, key string, msg *amqp091.Publishing) error {
	for {
		s, err := e.waitPub(ctx)
		if err != nil {
			if err == errEngineStopped {
				return err
			}
			return fmt.Errorf("%w: %w", ErrUnconfirmed, err)
		}
		p, err := s.publish(exchange, key, msg)
		if err != nil {
			if !s.ch.IsClosed() {
				return fmt.Errorf("tinymq/amqp: publishing to %q: %w", exchange, err)
			}
			// Wait for the supervisor to notice, then try the next channel.
			select {
			case <-s.closed:
				continue
			case <-ctx.Done():
				return fmt.Errorf("%w: %w", ErrUnconfirmed, ctx.Err())
			}
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrUnconfirmed, ctx.Err())
		}
		switch {
		case p.lost:
			continue
		case !p.ack:
			return fmt.Errorf("%w: the broker refused the message (a queue at its length limit with reject-publish)", tinymq.ErrQueueFull)
		case p.returned:
			return fmt.Errorf("%w: exchange %q routed the message to no queue", tinymq.ErrNoRoute, exchange)
		}
		return nil
	}
}

// Publish encodes p.Data with the codec and publishes it persistent, with
// mandatory set, and waits for the broker's confirm (see [tinymq.Engine]).
func (e *engine) Publish(ctx context.Context, p tinymq.Publishing) error {
	if e.cfgErr != nil {
		return e.cfgErr
	}
	e.topoMu.RLock()
	ex := e.exchanges[p.Exchange]
	e.topoMu.RUnlock()
	if ex == nil {
		return fmt.Errorf("%w: %q (declare it in this MQ first)", tinymq.ErrUnknownExchange, p.Exchange)
	}
	if p.Delay > 0 && p.Expiration > 0 {
		return fmt.Errorf("%w: WithDelay together with WithExpiration (the broker drops a message's expiration when its delay ends)", tinymq.ErrUnsupported)
	}
	body, contentType, err := e.encode(p.Data)
	if err != nil {
		return err
	}
	headers, err := toTable(p.Headers)
	if err != nil {
		return fmt.Errorf("%w: %w", tinymq.ErrInvalidHeaders, err)
	}
	msg := amqp091.Publishing{
		Headers:      headers,
		ContentType:  contentType,
		DeliveryMode: amqp091.Persistent,
		MessageId:    strconv.FormatUint(e.ids.next(), 10),
		Timestamp:    time.Now(),
		Body:         body,
	}
	if p.Expiration > 0 {
		msg.Expiration = strconv.FormatInt(millis(p.Expiration), 10)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.publishTimeout)
	defer cancel()
	exchange := p.Exchange
	if p.Delay > 0 {
		wait, err := e.ensureDelay(p.Exchange, p.Delay)
		if err != nil {
			return err
		}
		if msg.Headers == nil {
			msg.Headers = amqp091.Table{}
		}
		msg.Headers[hdrWait] = wait
		exchange = waitExchange
	}
	err = e.publishConfirmed(ctx, exchange, p.RoutingKey, &msg)
	switch {
	case err == nil:
		ex.published.Add(1)
	case p.Delay == 0 && isNoRoute(err):
		ex.unroutable.Add(1)
	}
	return err
}

// ensureDelay declares, on first use, the delay queue of exchange for d: a
// queue whose messages expire after d into exchange, keeping their routing
// key and headers.
func (e *engine) ensureDelay(exchange string, d time.Duration) (string, error) {
	ms := millis(d)
	name := delayQueueName(exchange, ms)
	e.topoMu.RLock()
	_, ok := e.delays[name]
	e.topoMu.RUnlock()
	if ok {
		return name, nil
	}
	err := e.declare([]step{
		{kind: stepQueue, name: name, args: amqp091.Table{
			"x-message-ttl":          ms,
			"x-dead-letter-exchange": exchange,
		}},
		{kind: stepBind, name: name, exchange: waitExchange, args: amqp091.Table{"x-match": "all", hdrWait: name}},
	})
	return name, err
}

// encode marshals data with the codec, which is user code: a panic becomes
// an error. An [tinymq.Encoded] (a message that a consumer received, passed
// on) keeps its bytes, as a durable queue keeps them: encoded again it would
// be the struct that holds them, which a typed consumer decodes into a zero
// value without an error.
func (e *engine) encode(data any) (body []byte, contentType string, err error) {
	if enc, ok := data.(tinymq.Encoded); ok {
		return enc.Body, e.codec.ContentType(), nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: the codec panicked: %s", tinymq.ErrPayloadType, guard.ValueText(r))
		}
	}()
	body, err = e.codec.Marshal(data)
	if err != nil {
		return nil, "", fmt.Errorf("%w: encoding %T: %w", tinymq.ErrPayloadType, data, err)
	}
	return body, e.codec.ContentType(), nil
}
