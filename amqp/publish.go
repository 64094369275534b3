package amqp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/guard"
)

// pubSession is one publishing channel in confirm mode. Its confirm loop
// (started by openPub, joined by whoever waits for closed) settles each
// publish when the broker has confirmed it, and, when the channel closes,
// decides what becomes of the publishes still waiting.
//
// Which tags the broker confirmed, the loop learns from the library's
// confirmation stream, which comes in tag order; whether a tag was acked or
// nacked it takes from the publish's own DeferredConfirmation, which the
// library settles before it puts the tag in the stream. The stream's own Ack
// is wrong when the broker confirms out of order: the library gives a
// multiple ack (or nack) to every tag up to it, including a tag that the
// broker had already settled the other way (a reject-publish nack comes at
// once, the acks of its neighbours after their fsync, several in one).
//
// A basic.return always reaches the client before the basic.ack of the same
// message, and the client library hands both over from one reader goroutine.
// The returns channel is unbuffered, so the loop has taken a return before the
// library even queues the ack behind it: when the loop sees the ack, it has
// already noted the return.
type pubSession struct {
	ch     *amqp091.Channel
	limit  *atomic.Int64 // the engine's message size limit, lowered when the broker says so
	closed chan struct{} // closed when the loop has ended: the channel is gone

	mu       sync.Mutex
	pending  map[uint64]*pendingPub // by delivery tag
	early    map[uint64]bool        // tags confirmed before their publish was noted
	returned map[string]int         // returnKeys of messages returned and not yet confirmed
	dead     bool
}

// pendingPub is one publish waiting for its confirm. Its fields below done
// are written before done is closed; at most one of lost, processed and
// refusal is set, and then ack and returned mean nothing.
type pendingPub struct {
	key      string // its returnKey
	exchange string
	size     int
	dc       *amqp091.DeferredConfirmation
	done     chan struct{}

	ack       bool  // the broker took it (false: nack)
	returned  bool  // mandatory and unroutable
	lost      bool  // the channel closed before the broker saw it, or with the connection: publish it again
	processed bool  // the broker routed it, then closed the channel before confirming: sending it again would duplicate it
	refusal   error // the broker closed the channel because of this publish
}

// returnKey identifies a publish among those of a channel that a return may
// be for: its message ID (unique to each Publish, kept by the retries of a
// delivery) and the wait queue it goes to (a retry's or a delay's), which
// tells apart the retries of one message for several queues.
func returnKey(id string, headers amqp091.Table) string {
	wait, _ := headers[hdrWait].(string)
	return id + "\x00" + wait
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
		limit:    &e.maxSize,
		closed:   make(chan struct{}),
		pending:  make(map[uint64]*pendingPub),
		early:    make(map[uint64]bool),
		returned: make(map[string]int),
	}
	returns := ch.NotifyReturn(make(chan amqp091.Return))
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 256))
	closes := ch.NotifyClose(make(chan *amqp091.Error, 1))
	go s.loop(returns, confirms, closes)
	return s, nil
}

// loop runs until the library closes the returns and confirms channels,
// which it does when the AMQP channel closes; then it settles every publish
// still waiting by why the channel closed (see closeLocked).
func (s *pubSession) loop(returns <-chan amqp091.Return, confirms <-chan amqp091.Confirmation, closes <-chan *amqp091.Error) {
	defer close(s.closed)
	for returns != nil || confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.mu.Lock()
			s.returned[returnKey(r.MessageId, r.Headers)]++
			s.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			s.mu.Lock()
			if p := s.pending[c.DeliveryTag]; p != nil {
				delete(s.pending, c.DeliveryTag)
				s.settleLocked(p)
			} else {
				s.early[c.DeliveryTag] = true
			}
			s.mu.Unlock()
		}
	}
	// The library sends the reason, if any, before it closes closes; a
	// channel closed with its connection has the connection's.
	var reason *amqp091.Error
	for aerr := range closes {
		if reason == nil {
			reason = aerr
		}
	}
	s.mu.Lock()
	s.dead = true
	s.closeLocked(reason)
	s.mu.Unlock()
}

// settleLocked settles p, which the broker confirmed: its DeferredConfirmation
// says how, and is settled already (see pubSession).
func (s *pubSession) settleLocked(p *pendingPub) {
	p.ack = p.dc.Acked()
	if n := s.returned[p.key]; n > 0 {
		p.returned = true
		if n == 1 {
			delete(s.returned, p.key)
		} else {
			s.returned[p.key] = n - 1
		}
	}
	close(p.done)
}

// closeLocked settles the publishes still waiting when the channel closed.
// When the broker closed the channel because of one publish (a message above
// its size limit, an exchange that is not there, a refused permission), it
// has routed every publish before that one, in tag order, and seen none
// after it: those before are processed (their confirms are lost with the
// channel, and sending them again would deliver them twice), the one is
// refused or (an exchange deleted behind the engine's back, declared again
// before the next channel opens) lost, those after are lost and sent again.
// A channel closed for another reason, or with its connection, loses every
// waiting publish: the broker may or may not have each (at least once).
func (s *pubSession) closeLocked(reason *amqp091.Error) {
	tags := slices.Sorted(maps.Keys(s.pending))
	culprit, refusal := -1, error(nil)
	if reason != nil && reason.Server && reason.Recover { // a channel error, not the connection's
		culprit, refusal = s.culpritLocked(tags, reason)
	}
	for i, tag := range tags {
		p := s.pending[tag]
		delete(s.pending, tag)
		switch {
		case culprit < 0 || i > culprit:
			p.lost = true
		case i < culprit:
			p.processed = true
		case refusal != nil:
			p.refusal = refusal
		default:
			p.lost = true
		}
		close(p.done)
	}
}

// maxSizeText is how RabbitMQ refuses a message above its max_message_size
// ("message size 2097152 is larger than configured max size 1048576").
var maxSizeText = regexp.MustCompile(`message size (\d+) is larger than (?:configured )?max size (\d+)`)

// exchangeText finds the exchange that RabbitMQ names in a refusal ("no
// exchange 'x' in vhost '/'", "access to exchange 'x' in vhost '/' refused").
var exchangeText = regexp.MustCompile(`exchange '((?:[^']|'[^ ])*)' in vhost`)

// culpritLocked finds, among the waiting publishes (tags, in order), the
// one that the broker closed the channel for, and the error to return for
// it (nil: publish it again); -1 when the reason names none. A size refusal
// names the size, so the culprit is exact (no earlier message of that size
// passed). An exchange refusal names the exchange, and the first waiting
// publish to it is taken: if some were sent to it before it was deleted, an
// earlier one may be taken, and the publishes between it and the real
// culprit are sent again (at least once, as after a lost connection).
func (s *pubSession) culpritLocked(tags []uint64, reason *amqp091.Error) (int, error) {
	switch reason.Code {
	case amqp091.PreconditionFailed:
		m := maxSizeText.FindStringSubmatch(reason.Reason)
		if m == nil {
			return -1, nil
		}
		size, err1 := strconv.Atoi(m[1])
		limit, err2 := strconv.ParseInt(m[2], 10, 64)
		if err1 != nil || err2 != nil {
			return -1, nil
		}
		lowerLimit(s.limit, limit)
		i := slices.IndexFunc(tags, func(t uint64) bool { return s.pending[t].size == size })
		return i, fmt.Errorf("%w: %d bytes, more than the broker's max_message_size of %d", tinymq.ErrTooLarge, size, limit)
	case amqp091.NotFound, amqp091.AccessRefused:
		m := exchangeText.FindStringSubmatch(reason.Reason)
		if m == nil {
			return -1, nil
		}
		i := slices.IndexFunc(tags, func(t uint64) bool { return s.pending[t].exchange == m[1] })
		if reason.Code == amqp091.NotFound {
			return i, nil // declared again before the next channel opens (see session)
		}
		return i, fmt.Errorf("tinymq/amqp: the broker refused the publish to %q: %w", m[1], reason)
	}
	return -1, nil
}

// lowerLimit lowers the size limit at p to n, if n is lower.
func lowerLimit(p *atomic.Int64, n int64) {
	for {
		cur := p.Load()
		if n >= cur || p.CompareAndSwap(cur, n) {
			return
		}
	}
}

// publish sends msg and returns the publish to wait for. An error means the
// channel is closed or closing.
func (s *pubSession) publish(exchange, key string, msg *amqp091.Publishing) (*pendingPub, error) {
	dc, err := s.ch.PublishWithDeferredConfirm(exchange, key, true, false, *msg)
	if err != nil {
		return nil, err
	}
	p := &pendingPub{key: returnKey(msg.MessageId, msg.Headers), exchange: exchange, size: len(msg.Body),
		dc: dc, done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.early[dc.DeliveryTag]:
		delete(s.early, dc.DeliveryTag)
		s.settleLocked(p)
	case s.dead:
		p.lost = true
		close(p.done)
	default:
		s.pending[dc.DeliveryTag] = p
	}
	return p, nil
}

// errShutdownCut is why a publish still waiting for its confirm when a
// Shutdown deadline passed returns.
var errShutdownCut = errors.New("the engine shut down (its deadline passed) before the broker confirmed the message")

// publishConfirmed publishes msg with mandatory set and waits for the broker's
// confirm, sending it again on the next connection if the connection is lost
// first, until ctx ends. It returns nil only for a message the broker
// confirmed and routed; ErrStopped only when the engine shut down before the
// message was ever sent; ErrUnconfirmed when the broker may have it.
func (e *engine) publishConfirmed(ctx context.Context, exchange, key string, msg *amqp091.Publishing) error {
	sent := false // the broker may have had the message since
	for {
		if err := e.checkSize(len(msg.Body)); err != nil {
			return err // only after the broker lowered the limit, when sent is false
		}
		s, err := e.waitPub(ctx)
		if err != nil {
			return unconfirmed(sent, err)
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
				return unconfirmed(sent, ctx.Err())
			case <-e.abort:
				return unconfirmed(sent, errEngineStopped)
			}
		}
		sent = true
		select {
		case <-p.done:
		case <-ctx.Done():
			return fmt.Errorf("%w%s: %w", ErrUnconfirmed, e.blockedNote(), ctx.Err())
		case <-e.abort:
			return fmt.Errorf("%w: %w; the broker may have it", ErrUnconfirmed, errShutdownCut)
		}
		switch {
		case p.lost:
			continue
		case p.processed:
			return fmt.Errorf("%w: the broker received the message, then closed the channel (refusing another publish) before confirming it; it is not sent again, which could deliver it twice", ErrUnconfirmed)
		case p.refusal != nil:
			return p.refusal
		case !p.ack:
			e.afterNack(s)
			return e.nackError()
		case p.returned:
			return fmt.Errorf("%w: exchange %q routed the message to no queue", tinymq.ErrNoRoute, exchange)
		}
		return nil
	}
}

// unconfirmed is the error of a publish that gave up waiting for a
// connection because of err: the engine's stop ([tinymq.ErrStopped]) when
// the message was never sent, otherwise ErrUnconfirmed (the broker may have
// it: a connection lost before its confirm, and none to send it again on).
func unconfirmed(sent bool, err error) error {
	switch {
	case !sent:
		if errors.Is(err, tinymq.ErrStopped) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnconfirmed, err)
	case errors.Is(err, tinymq.ErrStopped):
		return fmt.Errorf("%w: its connection was lost before the broker confirmed the message, and the engine shut down before it could be sent again; the broker may have it", ErrUnconfirmed)
	}
	return fmt.Errorf("%w: its connection was lost before the broker confirmed the message, which it may have: %w", ErrUnconfirmed, err)
}

// Publish encodes p.Data with the codec and publishes it persistent, with
// mandatory set, and waits for the broker's confirm (see [tinymq.Engine]).
// What the broker would refuse by closing the channel or the connection (a
// header of the engine's or of the broker's dead-lettering, a name or a
// property over AMQP's 255 bytes, a body over the broker's size limit) is
// refused first, and nothing is sent.
func (e *engine) Publish(ctx context.Context, p tinymq.Publishing) error {
	if err := e.usable(); err != nil {
		return err
	}
	if !e.pubs.enter(e.stop) {
		return errEngineStopped
	}
	defer e.pubs.leave()
	e.topoMu.RLock()
	ex := e.exchanges[p.Exchange]
	e.topoMu.RUnlock()
	if ex == nil && e.external(p.Exchange) {
		// Another service's: check, once, that the broker has it.
		xkind := ""
		if p.Exchange == DefaultExchange {
			xkind = tinymq.Direct.String()
		}
		if err := e.declare([]step{{kind: stepExchange, name: p.Exchange, xkind: xkind, passive: true}}); err != nil {
			return err
		}
		e.topoMu.RLock()
		ex = e.exchanges[p.Exchange]
		e.topoMu.RUnlock()
	}
	if ex == nil {
		return fmt.Errorf("%w: %q (declare it in this MQ first)", tinymq.ErrUnknownExchange, p.Exchange)
	}
	if p.Delay > 0 && p.Expiration > 0 {
		return fmt.Errorf("%w: WithDelay together with WithExpiration (the broker drops a message's expiration when its delay ends)", tinymq.ErrUnsupported)
	}
	if err := checkHeaders(p.Headers); err != nil {
		return err
	}
	if p.Delay > 0 {
		if err := checkName("the delay queue of exchange", delayQueueName(p.Exchange, millis(p.Delay))); err != nil {
			return err
		}
	}
	body, contentType, err := e.encode(p.Data)
	if err != nil {
		return err
	}
	if err := e.checkSize(len(body)); err != nil {
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
	exchange := wireExchange(p.Exchange)
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

// checkHeaders refuses the headers that a publish must not set: the
// engine's own (tinymq-*, which route retries and delays); those of the
// broker's dead-lettering (x-death, x-first-death-*, x-last-death-*), from
// which consumers learn a message's attempt and deaths: a publisher setting
// them would forge a history; and CC and BCC, which RabbitMQ's
// sender-selected distribution takes for more routing keys: the message
// would reach queues that its exchange and routing key do not route it to
// (in memory a header never routes).
func checkHeaders(h map[string]any) error {
	for k := range h {
		switch {
		case k == "CC" || k == "BCC":
			return fmt.Errorf("%w: header %q: RabbitMQ routes the message to the routing keys it lists too (sender-selected distribution)", tinymq.ErrUnsupported, k)
		case strings.HasPrefix(k, hdrPrefix):
			return fmt.Errorf("%w: header %q: the prefix %q is the engine's", tinymq.ErrUnsupported, k, hdrPrefix)
		case deathHeader(k):
			return fmt.Errorf("%w: header %q: the broker's dead-lettering sets it, and it says how often the message failed (Msg.Attempt, Msg.Deaths)", tinymq.ErrUnsupported, k)
		}
	}
	return nil
}

// checkSize refuses a body larger than the broker takes: RabbitMQ's ceiling
// (512 MiB) until the broker refused one with its own, lower,
// max_message_size, which the engine keeps from then on.
func (e *engine) checkSize(n int) error {
	if limit := e.maxSize.Load(); int64(n) > limit {
		return fmt.Errorf("%w: %d bytes encoded, more than the broker takes (%d)", tinymq.ErrTooLarge, n, limit)
	}
	return nil
}

// maxBrokerSize is the largest message RabbitMQ ever takes (its
// max_message_size cannot be set higher).
const maxBrokerSize = 512 << 20

// maxName is AMQP's limit on names, keys and other short strings.
const maxName = 255

// checkName refuses a name that AMQP cannot carry. The client library would
// fail to encode it and close the whole connection, which every publish and
// consumer shares.
func checkName(what, name string) error {
	if len(name) > maxName {
		return fmt.Errorf("%w: %s %.40q... is %d bytes; AMQP names are at most %d", tinymq.ErrKeyTooLong, what, name, len(name), maxName)
	}
	return nil
}

// ensureDelay declares, at its first use on a connection and whenever its
// lease needs renewing (see ensureHelper), the delay queue of exchange for d:
// a queue whose messages expire after d into exchange, keeping their routing
// key and headers. It records the queue for DeleteExchange.
func (e *engine) ensureDelay(exchange string, d time.Duration) (string, error) {
	ms := millis(d)
	name := delayQueueName(exchange, ms)
	if err := e.ensureHelper(name, ms, wireExchange(exchange)); err != nil {
		return name, err
	}
	e.topoMu.Lock()
	e.delays[name] = exchange
	e.topoMu.Unlock()
	return name, nil
}

// encode marshals data with the codec, which is user code: a panic becomes
// an error. An [tinymq.Encoded] (a message that a consumer received, passed
// on) keeps its bytes, as a durable queue keeps them: encoded again it would
// be the struct that holds them, which a typed consumer decodes into a zero
// value without an error. A content type over AMQP's 255 bytes is refused:
// the client library could not encode it.
func (e *engine) encode(data any) (body []byte, contentType string, err error) {
	defer func() {
		if r := recover(); r != nil {
			body, contentType = nil, ""
			err = fmt.Errorf("%w: the codec panicked: %s", tinymq.ErrPayloadType, guard.ValueText(r))
		}
	}()
	if enc, ok := data.(tinymq.Encoded); ok {
		body = enc.Body
	} else if body, err = e.codec.Marshal(data); err != nil {
		return nil, "", fmt.Errorf("%w: encoding %T: %w", tinymq.ErrPayloadType, data, err)
	}
	contentType = e.codec.ContentType()
	if len(contentType) > maxName {
		return nil, "", fmt.Errorf("%w: the codec's content type is %d bytes; AMQP allows %d", tinymq.ErrInvalidOption, len(contentType), maxName)
	}
	return body, contentType, nil
}

// flight counts the Publishes under way, so that Shutdown can let them have
// their confirm before it closes the connection, and know when they have all
// returned.
type flight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; replaced when it rises again
}

func newFlight() *flight {
	f := &flight{idle: make(chan struct{})}
	close(f.idle)
	return f
}

// enter counts one more Publish, unless stop is closed. It counts before it
// looks, so that a Shutdown that closed stop and then saw none under way
// cannot miss one that looked before.
func (f *flight) enter(stop <-chan struct{}) bool {
	f.mu.Lock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
	f.mu.Unlock()
	select {
	case <-stop:
		f.leave()
		return false
	default:
		return true
	}
}

func (f *flight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n--; f.n == 0 {
		close(f.idle)
	}
}

// done returns a channel closed once no Publish is under way.
func (f *flight) done() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.idle
}
