package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/backoff"
	"github.com/tinymq/tinymq/internal/guard"
	"github.com/tinymq/tinymq/internal/hist"
)

// cqueue is one declared queue: its settings, its retry wait queues, the
// subscriptions that consume it, and its counters. Its subscriptions share
// its counters, its retry policy and its dead-letter exchange.
//
// Lock order: engine mu before cqueue mu; a subscription's state is under its
// queue's mu.
type cqueue struct {
	e      *engine
	spec   tinymq.QueueSpec // as first declared; its Consumer is the first subscription's
	waits  []int64          // the retry wait of attempt i+1, in ms, before jitter
	levels [][]int64        // the waits that attempt i+1's jittered wait is rounded to (see wait.go)
	waitQs []string         // every wait queue it may have, this layout's and the earlier one's

	mu       sync.Mutex
	subs     []*subscription // those not cancelled
	retired  []*subscription // those it had when it was deleted
	paused   bool            // PauseQueue: its subscriptions do not consume
	deleting bool            // a DeleteQueue is under way: a cancel from the broker is expected
	gone     bool            // deleted or expired: its subscriptions end, failures are not retried
	changed  chan struct{}   // closed and replaced whenever the above or a subscription's state changes

	inFlight atomic.Int64
	c        queueCounters
	hist     hist.Histogram // the core's buckets: ConsumerTime means the same on both engines
}

type queueCounters struct {
	delivered, succeeded, failed, retried, deadLettered, dropped, purged, removed atomic.Uint64
}

// subscription is one consumer of a queue (a basic.consume): the one
// RegisterQueue attached, or one of [engine.Consume]. It is the
// [tinymq.EngineSubscription] that Consume returns.
//
// Goroutines: run, its manager, is started by startSubLocked once the engine
// is started and joined by finish (mgrWG); it starts the workers (wrkWG,
// joined by finish; also by run itself unless a Shutdown deadline passed).
// The manager opens a channel on the consuming connection, consumes, and
// publishes the delivery channel in cur; the workers take deliveries from
// whichever cur is current, so they live across reconnects, pauses and
// resumes. done is closed when the manager has returned (or when it will
// never start).
type subscription struct {
	q           *cqueue
	fn          tinymq.ConsumerFunc
	concurrency int
	prefetch    int
	tag         string        // consumer tag
	quit        chan struct{} // closed when it is cancelled, or its queue is gone
	done        chan struct{}
	doneOnce    sync.Once
	workers     sync.WaitGroup

	// Under q.mu:
	cur       <-chan amqp091.Delivery // nil while there is none to read
	live      <-chan amqp091.Delivery // cur while its deliveries are to be handled; nil once they go back
	stopping  bool                    // the workers leave once cur is drained
	consuming bool                    // from before basic.consume until basic.cancel-ok or the channel's end
	cancelled bool
	started   bool
}

var _ tinymq.EngineSubscription = (*subscription)(nil)

// retryBackoff is the backoff of a queue's retry policy, computed as the
// core computes it.
func retryBackoff(p tinymq.RetryPolicy) backoff.Policy {
	return backoff.Policy{Initial: p.InitialBackoff, Max: p.MaxBackoff, Multiplier: p.Multiplier, Jitter: p.Jitter}
}

// retryWaits returns the backoffs of a policy before jitter, in ms, by failed
// attempt, up to the first that reaches MaxBackoff: every later attempt
// waits as long (see waitFor).
func retryWaits(p tinymq.RetryPolicy) []int64 {
	b := retryBackoff(p)
	var waits []int64
	for a := 1; a < p.MaxAttempts; a++ {
		d := b.Base(a)
		waits = append(waits, millis(d))
		if d >= p.MaxBackoff {
			break // every later wait is the same
		}
	}
	return waits
}

// waitFor returns the wait queue and the wait after the given failed
// attempt: its backoff, jittered and rounded to the nearest of the step's
// levels, each the TTL of a wait queue of its own (see wait.go).
func (q *cqueue) waitFor(attempt int) (queue string, ms int64) {
	i := min(attempt, len(q.waits)) - 1
	ms = q.waits[i]
	if q.spec.Retry.Jitter > 0 {
		ms = millis(retryBackoff(q.spec.Retry).Jittered(time.Duration(ms) * time.Millisecond))
		ms = nearestLevel(q.levels[i], ms)
	}
	return retryQueueName(q.spec.Name, ms), ms
}

func newQueue(e *engine, spec tinymq.QueueSpec) *cqueue {
	q := &cqueue{e: e, spec: spec, changed: make(chan struct{})}
	if spec.Retry.MaxAttempts > 1 {
		q.waits = retryWaits(spec.Retry)
		seen := make(map[int64]bool)
		for _, base := range q.waits {
			levels := jitterLevels(base, spec.Retry.Jitter)
			q.levels = append(q.levels, levels)
			for _, ms := range levels {
				if !seen[ms] {
					seen[ms] = true
					q.waitQs = append(q.waitQs, retryQueueName(spec.Name, ms))
				}
			}
		}
		for _, base := range q.waits {
			q.waitQs = append(q.waitQs, oldRetryQueueName(spec.Name, base))
		}
	}
	return q
}

// owns reports whether a recorded step declares q, one of its wait queues, or
// a binding of one of them.
func (q *cqueue) owns(s step) bool {
	return s.kind != stepExchange && (s.name == q.spec.Name || slices.Contains(q.waitQs, s.name))
}

// signalLocked wakes everyone waiting for q's state to change. q.mu is held.
func (q *cqueue) signalLocked() {
	close(q.changed)
	q.changed = make(chan struct{})
}

func (q *cqueue) isGone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.gone
}

// setDeleting marks a DeleteQueue under way, or over.
func (q *cqueue) setDeleting(on bool) {
	q.mu.Lock()
	q.deleting = on
	q.signalLocked()
	q.mu.Unlock()
}

// awaitDecided waits while a DeleteQueue is under way, and reports whether
// q is gone.
func (q *cqueue) awaitDecided() (gone bool) {
	for {
		q.mu.Lock()
		deleting, gone, changed := q.deleting, q.gone, q.changed
		q.mu.Unlock()
		if !deleting {
			return gone
		}
		select {
		case <-changed:
		case <-q.e.stop:
			return q.isGone()
		}
	}
}

// newSubscription returns a subscription of q, not yet added to it.
func newSubscription(q *cqueue, fn tinymq.ConsumerFunc, concurrency, prefetch int) *subscription {
	return &subscription{
		q: q, fn: fn, concurrency: concurrency, prefetch: prefetch,
		tag:  "tinymq-" + strconv.FormatUint(rand.Uint64(), 36),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
}

func (s *subscription) closeDone() { s.doneOnce.Do(func() { close(s.done) }) }

// cancelLocked marks s cancelled, unless it was, and takes it out of its
// queue; one that never started is done. It reports whether it cancelled s.
// q.mu is held.
func (s *subscription) cancelLocked() bool {
	if s.cancelled {
		return false
	}
	q := s.q
	s.cancelled = true
	// From now on, what its workers take goes back: nothing begins after
	// Cancel returned, though the manager has yet to cancel the consumer.
	s.stopping, s.live = true, nil
	close(s.quit)
	q.subs = slices.DeleteFunc(slices.Clone(q.subs), func(o *subscription) bool { return o == s })
	if !s.started {
		s.closeDone()
	}
	q.signalLocked()
	return true
}

// Cancel ends the subscription, as basic.cancel does: the broker hands it no
// new message, the messages it had prefetched and not begun go back to the
// queue (nacked with requeue), and Cancel waits for the deliveries in its
// consumer until ctx ends, returning ctx's error then: they finish and are
// settled in the background, on the channel, which closes after them. It is
// idempotent: a second Cancel waits as the first does. Called from a
// consumer it does not wait for the deliveries in the consumers, since it
// could be waiting for itself, only (until ctx ends) for the broker's
// basic.cancel-ok, so that a message published after it returns goes to
// the queue's other consumers and not, nacked, behind them; called from
// anything else the engine runs (the logger) it returns nil without
// waiting. A cancelled subscription never consumes again, after a
// reconnect included. After Shutdown it returns once the subscription's
// workers have.
func (s *subscription) Cancel(ctx context.Context) error {
	q, e := s.q, s.q.e
	q.mu.Lock()
	s.cancelLocked()
	q.mu.Unlock()
	if e.workers.Mine() {
		return s.awaitUnhooked(ctx)
	}
	if e.own.Mine() {
		return nil
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitUnhooked waits, for a Cancel from a consumer, until the broker no
// longer delivers to s (its manager had the consumer's basic.cancel-ok, the
// channel ended, or the manager returned), or until ctx ends. The manager
// does that before it waits for the workers, and bounds its calls on the
// channel (callBounded), so that a worker can wait for it.
func (s *subscription) awaitUnhooked(ctx context.Context) error {
	q := s.q
	for {
		q.mu.Lock()
		consuming, changed := s.consuming, q.changed
		q.mu.Unlock()
		if !consuming {
			return nil
		}
		select {
		case <-changed:
		case <-s.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run is the subscription's manager (see subscription).
func (s *subscription) run(ctx context.Context) {
	e := s.q.e
	defer e.mgrWG.Done()
	defer s.closeDone()
	defer e.own.Leave(e.own.Enter()) // it logs: the logger may call Stop
	for range s.concurrency {
		s.workers.Add(1)
		e.wrkWG.Add(1)
		go s.work(ctx)
	}
	// failed counts the attempts since the last that got as far as consuming.
	failed := 0
	for {
		conn, lost, ok := e.waitSub(s.quit)
		if !ok {
			break
		}
		stopped, consumed := s.consume(conn, lost)
		if stopped {
			return
		}
		if consumed {
			failed = 0
		}
		failed++
		t := time.NewTimer(e.cfg.reconnect.Wait(failed))
		select {
		case <-t.C:
		case <-e.stop:
			t.Stop()
		case <-s.quit:
			t.Stop()
		}
	}
	s.setStopping()
	s.awaitWorkers()
}

// consume consumes on one channel until it or its connection is lost, or
// the subscription ends (Shutdown, Cancel, its queue gone); while the queue
// is paused it keeps the channel and does not consume. stopped says that
// it handled the end; consumed, that it got as far as consuming.
func (s *subscription) consume(conn *amqp091.Connection, lost <-chan struct{}) (stopped, consumed bool) {
	q, e := s.q, s.q.e
	var ch *amqp091.Channel
	err := e.callBounded(conn, "opening a consumer channel", func() (err error) {
		ch, err = conn.Channel()
		return err
	})
	if err != nil {
		return false, false
	}
	defer func() { _ = e.callBounded(conn, "closing a consumer channel", ch.Close) }()
	defer s.setConsuming(false)
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	if err := e.callBounded(conn, "setting the prefetch", func() error { return ch.Qos(s.prefetch, 0, false) }); err != nil {
		e.logWarn("tinymq/amqp: setting the prefetch failed", "queue", q.spec.Name, "err", err.Error())
		return false, false
	}
	for {
		// consuming is set before basic.consume, under the lock that
		// PauseQueue takes, so that a PauseQueue waits for this consumer to
		// be cancelled again.
		q.mu.Lock()
		paused, changed, ended := q.paused, q.changed, s.cancelled
		s.consuming = !paused && !ended
		q.mu.Unlock()
		if ended {
			// Checked under the lock that Cancel takes: a subscription
			// cancelled while its queue was paused, or its connection lost,
			// never consumes again (a Cancel from its own consumer has
			// returned, and what is published now is the other consumers').
			s.stopConsuming(conn, ch, nil)
			return true, true
		}
		if paused {
			select {
			case <-changed:
				continue
			case <-lost:
			case aerr := <-closed:
				e.logWarn("tinymq/amqp: consumer channel closed; consuming again", "queue", q.spec.Name, "err", guard.ErrorText(aerr))
			case <-e.stop:
				s.stopConsuming(conn, ch, nil)
				return true, true
			case <-s.quit:
				s.stopConsuming(conn, ch, nil)
				return true, true
			}
			return false, consumed
		}
		var dels <-chan amqp091.Delivery
		err := e.callBounded(conn, "consuming", func() (err error) {
			dels, err = ch.Consume(q.spec.Name, s.tag, false, false, false, false, nil)
			return err
		})
		if err != nil {
			s.setConsuming(false)
			if conn.IsClosed() {
				return false, consumed
			}
			if amqpCode(err) == amqp091.NotFound && q.spec.Expiry > 0 {
				// Unused for its x-expires, the broker deleted it: forget it
				// (which ends this subscription), rather than declare it again.
				e.expire(q, conn)
				return false, consumed
			}
			e.logWarn("tinymq/amqp: consuming failed; declaring and trying again", "queue", q.spec.Name, "err", err.Error())
			e.redeclareAll(conn) // the queue may have been deleted
			return false, consumed
		}
		consumed = true
		s.setCur(dels)
		switch s.consumeUntil(conn, ch, dels, lost, closed, cancelled) {
		case endStopped:
			return true, true
		case endLost:
			return false, true
		}
		// Paused: the consumer is cancelled and what it had taken went back.
	}
}

// consumeEnd is how consumeUntil ended.
type consumeEnd uint8

const (
	endPaused  consumeEnd = iota // the consumer is cancelled; the channel is open
	endLost                      // the channel, the connection or the consumer is lost: consume again
	endStopped                   // the subscription ended, and its workers returned
)

// consumeUntil waits, while the subscription consumes dels, for the queue to
// be paused (it then cancels the consumer), for the channel's end or the
// broker's cancel, or for the subscription's end (it then cancels the
// consumer and waits for the workers), and says which came.
func (s *subscription) consumeUntil(conn *amqp091.Connection, ch *amqp091.Channel, dels <-chan amqp091.Delivery, lost <-chan struct{},
	closed <-chan *amqp091.Error, cancelled <-chan string) consumeEnd {
	q, e := s.q, s.q.e
	for {
		q.mu.Lock()
		paused, changed := q.paused, q.changed
		q.mu.Unlock()
		if paused {
			if s.pause(conn, ch, dels) {
				return endPaused
			}
			return endLost
		}
		select {
		case <-changed:
		case <-lost:
			return endLost
		case aerr := <-closed:
			e.logWarn("tinymq/amqp: consumer channel closed; consuming again", "queue", q.spec.Name, "err", guard.ErrorText(aerr))
			return endLost
		case _, ok := <-cancelled:
			if !ok {
				return endLost // the channel closed: closed or lost says why
			}
			// The broker cancelled the consumer: its queue was deleted, by
			// this engine's DeleteQueue or behind its back. The library
			// closes dels once it handed over what it had; those deliveries
			// go back (to a deleted queue: nowhere).
			s.setConsuming(false)
			s.setLive(nil)
			s.drain(dels)
			if q.awaitDecided() {
				s.stopConsuming(conn, ch, nil) // gone: the deliveries in flight finish on this channel
				return endStopped
			}
			e.logWarn("tinymq/amqp: the broker cancelled the consumer (queue deleted?); declaring and consuming again", "queue", q.spec.Name)
			e.redeclareAll(conn)
			return endLost
		case <-e.stop:
			s.stopConsuming(conn, ch, dels)
			return endStopped
		case <-s.quit:
			s.stopConsuming(conn, ch, dels)
			return endStopped
		}
	}
}

// pause cancels the consumer (basic.cancel) for a paused queue and hands
// back what it had prefetched. It reports false if the channel had to be
// closed for it.
func (s *subscription) pause(conn *amqp091.Connection, ch *amqp091.Channel, dels <-chan amqp091.Delivery) bool {
	e := s.q.e
	s.setLive(nil)
	err := e.callBounded(conn, "cancelling a consumer", func() error { return ch.Cancel(s.tag, false) })
	if err != nil {
		_ = e.callBounded(conn, "closing a consumer channel", ch.Close) // the broker stops delivering either way
	}
	s.setConsuming(false)
	s.drain(dels)
	return err == nil
}

// stopConsuming ends the subscription on ch: it cancels the consumer when
// dels is not nil, hands back what the library had buffered, and waits for
// the workers to finish the messages they are in and leave. The caller
// closes the channel after it, which requeues whatever is still
// unacknowledged.
func (s *subscription) stopConsuming(conn *amqp091.Connection, ch *amqp091.Channel, dels <-chan amqp091.Delivery) {
	e := s.q.e
	s.setStopping()
	if dels != nil {
		if err := e.callBounded(conn, "cancelling a consumer", func() error { return ch.Cancel(s.tag, false) }); err != nil {
			_ = e.callBounded(conn, "closing a consumer channel", ch.Close) // the workers must not wait for a cancel that never comes
		}
		s.setConsuming(false)
		s.drain(dels)
	}
	s.awaitWorkers()
}

// errHeldBack is the error of a call on a consumer channel that the broker
// did not answer within closeTimeout.
var errHeldBack = fmt.Errorf("tinymq/amqp: the broker did not answer within %v; the consuming connection was closed", closeTimeout)

// callBounded runs fn, a call on a channel of the consuming connection conn
// that waits for the broker's reply (channel.open, basic.qos,
// basic.consume, basic.cancel, channel.close), and waits for it at most
// closeTimeout, or until a Shutdown deadline passes: a broker that holds
// back its replies (overloaded, or cut off while the TCP connection stays
// up) must not hold a Cancel, a PauseQueue or a Shutdown, as it does not
// hold the close handshake of a connection. The library offers no way to
// give up one call, so past that callBounded closes conn (waiting at most
// closeTimeout for the broker's close-ok, then dropping the socket), which
// ends fn and every channel on conn: the other subscriptions consume again on
// the next connection, and their unacknowledged messages are delivered
// again. It returns fn's error, or errHeldBack. The goroutine that runs fn
// is joined before it returns.
func (e *engine) callBounded(conn *amqp091.Connection, what string, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }() // joined below: closing conn ends fn
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	case <-e.abort:
	}
	e.logWarn("tinymq/amqp: the broker did not answer a consumer's call in time; closing the consuming connection",
		"call", what, "timeout", closeTimeout)
	closeConn(conn)
	<-done
	return errHeldBack
}

// drain nacks, with requeue, every delivery left in dels, which is no longer
// live, until the library closes it (after a cancel or the channel's end).
// The workers may take some of them too, and nack them as well.
func (s *subscription) drain(dels <-chan amqp091.Delivery) {
	for d := range dels {
		_ = d.Nack(false, true) // not begun: back to the broker for the next consumer
	}
	q := s.q
	q.mu.Lock()
	if s.cur == dels {
		s.cur = nil
	}
	q.signalLocked()
	q.mu.Unlock()
}

// awaitWorkers waits for this subscription's workers, or until a Shutdown
// deadline passed: then finish waits for them.
func (s *subscription) awaitWorkers() {
	done := make(chan struct{})
	go func() { // joined below, or ends when the workers do
		s.workers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-s.q.e.abort:
	}
}

func (s *subscription) setCur(c <-chan amqp091.Delivery) {
	q := s.q
	q.mu.Lock()
	s.cur = c
	if !s.stopping {
		s.live = c
	}
	q.signalLocked()
	q.mu.Unlock()
}

func (s *subscription) setLive(c <-chan amqp091.Delivery) {
	q := s.q
	q.mu.Lock()
	s.live = c
	q.signalLocked()
	q.mu.Unlock()
}

func (s *subscription) setConsuming(on bool) {
	q := s.q
	q.mu.Lock()
	if s.consuming != on {
		s.consuming = on
		q.signalLocked()
	}
	q.mu.Unlock()
}

func (s *subscription) setStopping() {
	q := s.q
	q.mu.Lock()
	if !s.stopping {
		s.stopping = true
		s.live = nil
		q.signalLocked()
	}
	q.mu.Unlock()
}

// next returns the next delivery, waiting across reconnects and pauses;
// handle is false for one that is to go back to the broker (it came after a
// pause or the end began); ok is false when the subscription stops and its
// current delivery channel is drained.
func (s *subscription) next() (d amqp091.Delivery, handle, ok bool) {
	q := s.q
	for {
		q.mu.Lock()
		cur, changed, stopping := s.cur, q.changed, s.stopping
		q.mu.Unlock()
		if cur == nil {
			if stopping {
				return d, false, false
			}
			<-changed
			continue
		}
		select {
		case d, ok := <-cur:
			q.mu.Lock()
			if ok {
				handle := s.live == cur
				q.mu.Unlock()
				return d, handle, true
			}
			if s.cur == cur {
				s.cur = nil
			}
			q.mu.Unlock()
		case <-changed:
		}
	}
}

// work is one worker; see subscription. A consumer that ends the goroutine
// with runtime.Goexit (as t.FailNow does) fails its delivery, and a new
// goroutine takes over the slot, so the subscription keeps its workers.
func (s *subscription) work(ctx context.Context) {
	e := s.q.e
	id := e.own.Enter()
	e.workers.Enter()
	returned := false
	defer func() {
		e.workers.Leave(id)
		e.own.Leave(id)
		if !returned {
			// Neither count has reached 0: this goroutine has not called Done.
			s.workers.Add(1)
			e.wrkWG.Add(1)
			go s.work(ctx)
		}
		s.workers.Done()
		e.wrkWG.Done()
	}()
	for {
		d, handle, ok := s.next()
		if !ok {
			returned = true
			return
		}
		if !handle {
			_ = d.Nack(false, true) // not begun: back to the broker for the next consumer
			continue
		}
		s.handle(ctx, &d)
	}
}

// handle runs the consumer on one delivery and settles it.
func (s *subscription) handle(ctx context.Context, d *amqp091.Delivery) {
	q := s.q
	m := q.e.toMsg(q.spec.Name, d)
	q.c.delivered.Add(1)
	q.inFlight.Add(1)
	start := time.Now()
	err := s.process(ctx, d, m, start)
	q.done(start)
	q.settle(d, m, err)
}

func (q *cqueue) done(start time.Time) {
	q.hist.Observe(time.Since(start))
	q.inFlight.Add(-1)
}

// process runs the consumer and returns its error frozen (see freezer), as
// the core does: a panic becomes a *tinymq.PanicError whose value is its
// text, a typed nil error one wrapping tinymq.ErrTypedNil, and any other
// error one whose methods never run the consumer's code again, so that
// settle and logMsg cannot. If the consumer calls runtime.Goexit (or its
// error's methods do), process settles the delivery itself with
// tinymq.ErrGoexit, as the goroutine will not return to do it.
func (s *subscription) process(ctx context.Context, d *amqp091.Delivery, m *tinymq.Msg, start time.Time) (err error) {
	q := s.q
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			err = freezer.FreezeAside(&q.e.own, &tinymq.PanicError{Value: r, Stack: debug.Stack()})
			return
		}
		q.done(start)
		q.settle(d, m, fmt.Errorf("%w (queue %q)", tinymq.ErrGoexit, q.spec.Name))
	}()
	err = s.fn(ctx, m)
	if err != nil {
		err = freezer.Freeze(err) // still guarded: its methods may call Goexit too
	}
	returned = true
	return err
}

// freezer freezes consumers' errors into the core's types, as the core does.
var freezer = guard.Freezer[*tinymq.PanicError]{
	TypedNil:  tinymq.ErrTypedNil,
	Permanent: tinymq.ErrPermanent,
	Panicked:  tinymq.ErrPanicked,
	Unpack:    func(pe *tinymq.PanicError) (any, []byte) { return pe.Value, pe.Stack },
	Pack: func(text string, stack []byte) *tinymq.PanicError {
		return &tinymq.PanicError{Value: text, Stack: stack}
	},
}

// settle acks a success; retries a failure through a wait queue, then acks;
// or nacks it without requeue, which the broker dead-letters to the queue's
// x-dead-letter-exchange.
func (q *cqueue) settle(d *amqp091.Delivery, m *tinymq.Msg, err error) {
	if err == nil {
		q.c.succeeded.Add(1)
		if aerr := d.Ack(false); aerr != nil {
			q.logMsg(slog.LevelWarn, m, "tinymq/amqp: ack failed; the broker will deliver the message again", aerr)
		}
		return
	}
	q.c.failed.Add(1)
	select {
	case <-q.e.abort:
		// Past a Shutdown deadline: neither retry nor dead-letter a message
		// whose consumer was cut short. Its channel is closing; the broker
		// delivers it again, marked redelivered, to the next consumer.
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: delivery failed after the shutdown deadline; the broker delivers it again", err)
		return
	default:
	}
	if q.isGone() {
		// Its queue was deleted (its wait queues with it): no retry and no
		// dead letter, as for the messages the delete removed.
		q.c.removed.Add(1)
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: delivery failed after its queue was deleted; the message is removed", err)
		_ = d.Nack(false, false)
		return
	}
	if m.Attempt < q.spec.Retry.MaxAttempts && !guard.Is(err, tinymq.ErrPermanent) {
		if rerr := q.retry(d, m); rerr != nil {
			q.logMsg(slog.LevelError, m, "tinymq/amqp: delivery failed and its retry could not be scheduled; the broker delivers it again at once", err,
				slog.String("retry_err", rerr.Error()))
			_ = d.Nack(false, true)
			return
		}
		q.c.retried.Add(1)
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: delivery failed, will retry", err)
		if aerr := d.Ack(false); aerr != nil {
			q.logMsg(slog.LevelWarn, m, "tinymq/amqp: ack after scheduling a retry failed; the message may run twice", aerr)
		}
		return
	}
	if q.spec.DeadLetterExchange != "" {
		q.c.deadLettered.Add(1)
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: message dead-lettered", err,
			slog.String("reason", string(tinymq.ReasonRejected)), slog.String("dead_letter_exchange", q.spec.DeadLetterExchange))
	} else {
		q.c.dropped.Add(1)
		q.logMsg(slog.LevelError, m, "tinymq/amqp: message dropped", err,
			slog.String("reason", string(tinymq.ReasonRejected)), slog.String("drop_cause", "no dead-letter exchange"))
	}
	if aerr := d.Nack(false, false); aerr != nil {
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: nack failed; the broker will deliver the message again", aerr)
	}
}

// retry publishes a copy of d to the wait queue of attempt m.Attempt (which
// it declares first if need be, see ensureHelper), with d's properties and
// headers (x-death included, which counts the attempts) and its routing key,
// and waits for the broker's confirm. The copy has no expiration: its wait
// queue's TTL is its wait.
func (q *cqueue) retry(d *amqp091.Delivery, m *tinymq.Msg) error {
	wait, ms := q.waitFor(m.Attempt)
	if err := q.e.ensureHelper(wait, ms, requeueExchange); err != nil {
		return err
	}
	h := make(amqp091.Table, len(d.Headers)+4)
	for k, v := range d.Headers {
		h[k] = v
	}
	h[hdrWait] = wait
	h[hdrQueue] = q.spec.Name
	h[hdrExchange] = m.Exchange
	h[hdrAttempt] = int64(m.Attempt + 1)
	msg := amqp091.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp091.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.e.cfg.publishTimeout)
	defer cancel()
	return q.e.publishConfirmed(ctx, waitExchange, d.RoutingKey, &msg)
}

// logMsg logs what became of m, with the consumer's error.
func (q *cqueue) logMsg(level slog.Level, m *tinymq.Msg, msg string, err error, extra ...slog.Attr) {
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String("exchange", m.Exchange),
		slog.String("queue", q.spec.Name),
		slog.Uint64("msg_id", m.ID),
		slog.Int("attempt", m.Attempt))
	if err != nil {
		attrs = append(attrs, slog.String("err", guard.ErrorText(err)))
		if pe, _ := guard.As[*tinymq.PanicError](err); pe != nil {
			attrs = append(attrs, slog.String("stack", string(pe.Stack)))
		}
	}
	q.e.logAttrs(level, msg, append(attrs, extra...)...)
}
