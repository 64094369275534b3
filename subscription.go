package tinymq

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Subscription is a pool of workers that [MQ.Consume] attached to a queue.
// Several subscriptions on one queue compete for its messages. End it with
// [Subscription.Cancel]; it ends with the MQ otherwise.
type Subscription struct {
	m       *MQ
	q       *queue
	c       consumer
	workers []*worker
	n       int                // concurrency
	eng     EngineSubscription // on an engine; then it has no workers

	// Under q.mu:
	cancelled bool
	started   bool          // its workers' goroutines were started
	alive     int           // its workers' goroutines that have not ended, abandoned ones included
	abandoned int           // goroutines whose call outlived WithDeliveryTimeout, another having taken their slot; at most n
	done      chan struct{} // closed when the last of them ended (or none was started)
}

// Consume attaches concurrency workers calling consumer to the queue, which
// [MQ.DeclareQueue] or [MQ.RegisterQueue] declared, as RabbitMQ's
// basic.consume does. Several subscriptions on one queue compete for its
// messages, each of which goes to one of them. Delivery starts at
// [MQ.Start], or at once when the MQ is running; retries, dead-lettering,
// panics and the context work as for RegisterQueue's consumer. It does not
// block on consumers. It returns an error matching [ErrUnknownQueue],
// [ErrNilConsumer] or [ErrInvalidConcurrency] for bad arguments, and
// [ErrStopped] once Stop has begun.
func (m *MQ) Consume(queue string, consumer ConsumerFunc, concurrency int) (*Subscription, error) {
	if consumer == nil {
		return nil, ErrNilConsumer
	}
	return m.consume(queue, consumerOf(consumer), concurrency)
}

// ConsumeHandler is [MQ.Consume] for a consumer of one payload type, as
// [RegisterHandler] is [MQ.RegisterQueue]: a delivery whose Data is already a
// T allocates nothing. The queue then takes only T: a Publish of data that
// can never be a T is refused with [ErrPayloadType]; a message that waited
// in the queue before (or a dead letter routed to it) of another type fails
// with a [Permanent] error wrapping ErrPayloadType. A nil fn is
// [ErrNilConsumer].
func ConsumeHandler[T any](m *MQ, queue string, fn func(ctx context.Context, v T) error, concurrency int) (*Subscription, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil MQ", ErrInvalidOption)
	}
	if fn == nil {
		return nil, ErrNilConsumer
	}
	return m.consume(queue, payloadConsumer(fn), concurrency)
}

// ConsumeDeliveries is [ConsumeHandler] for a consumer that needs the
// message's metadata as well, as [RegisterDeliveryHandler]. A nil fn is
// [ErrNilConsumer].
func ConsumeDeliveries[T any](m *MQ, queue string, fn func(ctx context.Context, d Delivery[T]) error, concurrency int) (*Subscription, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil MQ", ErrInvalidOption)
	}
	if fn == nil {
		return nil, ErrNilConsumer
	}
	return m.consume(queue, deliveryConsumer(fn), concurrency)
}

// consume is Consume for a consumer of either form.
func (m *MQ) consume(name string, c consumer, concurrency int) (*Subscription, error) {
	if concurrency < 1 || concurrency > MaxConcurrency {
		return nil, fmt.Errorf("%w: got %d, want 1 to %d", ErrInvalidConcurrency, concurrency, MaxConcurrency)
	}
	m.init()
	c = m.wrapConsumer(c)
	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return nil, ErrStopped
	}
	q := m.queues[name]
	if q == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if err := m.typeQueueLocked(q, c); err != nil { // typed publish: see handler.go
		return nil, err
	}
	if m.engine != nil {
		es, err := m.engine.Consume(name, c.fn, concurrency)
		if err != nil {
			return nil, err
		}
		s := &Subscription{m: m, q: q, c: c, n: concurrency, eng: es, done: make(chan struct{})}
		q.lock()
		q.subs = append(slices.Clip(q.subs), s)
		q.active += concurrency
		q.usedAt = time.Now().UnixNano()
		q.mu.Unlock()
		return s, nil
	}
	return m.subscribeLocked(q, c, concurrency), nil
}

// subscribeLocked attaches a subscription of concurrency workers running c to
// q, and starts them when the MQ is running. The caller holds the write
// lock, and the MQ is not stopping.
func (m *MQ) subscribeLocked(q *queue, c consumer, concurrency int) *Subscription {
	s := &Subscription{m: m, q: q, c: c, n: concurrency, done: make(chan struct{})}
	s.workers = make([]*worker, concurrency)
	for i := range s.workers {
		s.workers[i] = &worker{q: q, sub: s, c: c}
	}
	q.lock()
	q.subs = append(slices.Clip(q.subs), s)
	q.active += concurrency
	q.workers = append(slices.Clip(q.workers), s.workers...)
	q.usedAt = time.Now().UnixNano()
	wake := q.buf.n > 0 && m.state == stateRunning
	q.mu.Unlock()
	if m.state == stateRunning {
		m.startSub(s)
		if wake {
			// Others may have been paused out. s's own workers, started
			// above, may be among those it wakes: a woken worker leaves
			// idle and waking right by itself (see take).
			q.cond.Broadcast()
		}
	}
	return s
}

// startSub starts the workers of s. The caller holds the write lock and the
// MQ is running, so Stop cannot be waiting on the WaitGroup yet.
func (m *MQ) startSub(s *Subscription) {
	q := s.q
	q.lock()
	if s.cancelled || s.started {
		q.mu.Unlock()
		return
	}
	s.started = true
	s.alive = len(s.workers)
	q.mu.Unlock()
	m.wg.Add(len(s.workers))
	for _, w := range s.workers {
		go w.run(m.ctx, &m.wg)
	}
}

// Cancel ends the subscription, as RabbitMQ's basic.cancel does: it takes no
// new message, and the messages it had taken but not begun go back to the head
// of the queue, in their order, for the queue's other consumers (or to wait
// for the next). Cancel then waits for the deliveries it has in flight until
// ctx ends, and returns ctx's error if it ends first: they finish and are
// settled in the background. It is idempotent: a second Cancel waits as the
// first does. Called from one of the subscription's own consumers (or anything
// else the MQ runs), it cancels and returns nil without waiting for the
// deliveries in flight, since it would wait for itself; on an engine
// ([WithEngine]) a call from a consumer still waits, until ctx ends, for the
// broker to stop delivering to the subscription (see the engine's
// documentation), and returns ctx's error if it ends first. A queue left
// without consumers keeps its messages, and its [WithQueueExpiry] clock
// starts. After Stop the subscription has ended with the MQ: Cancel returns
// once its workers have. A nil ctx is [ErrInvalidOption], and nothing is
// cancelled.
func (s *Subscription) Cancel(ctx context.Context) error {
	if s == nil {
		return fmt.Errorf("%w: nil Subscription", ErrInvalidOption)
	}
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	q := s.q
	if s.eng != nil {
		q.removeSub(s)
		return s.eng.Cancel(ctx)
	}
	if q.removeSub(s) {
		q.armQueueExpiry()
	}
	if s.m.own.Mine() {
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

// removeSub cancels s, unless it was: its unbegun entries go back to buf,
// and its parked workers wake to leave. It reports whether it cancelled s.
func (q *queue) removeSub(s *Subscription) bool {
	q.lock()
	if s.cancelled {
		q.mu.Unlock()
		return false
	}
	q.cancelLocked(s)
	q.mq.topologyClock().Add(1) // QueueInfo.Consumers and Concurrency
	if len(q.subs) == 0 {
		q.usedAt = time.Now().UnixNano()
	}
	// A stopping MQ waits for this queue while a consumer could take what
	// waits in it (a retry backing off, a delayed message); without one,
	// that now stays undelivered, and no worker may be left to report it.
	q.reportIfQuiescentLocked()
	q.mu.Unlock()
	q.cond.Broadcast()
	return true
}

// cancelLocked marks s cancelled and takes it out of q. Every parked worker
// is to wake (the caller broadcasts once q.mu is released): s's leave, and
// the others take what s gave back. q.mu is held.
func (q *queue) cancelLocked(s *Subscription) {
	s.cancelled = true
	q.subs = slices.DeleteFunc(slices.Clone(q.subs), func(o *Subscription) bool { return o == s })
	q.active -= s.n
	if s.eng != nil {
		return
	}
	q.giveBackLocked(s.workers)
	if !s.started {
		q.workers = slices.DeleteFunc(slices.Clone(q.workers), func(w *worker) bool { return w.sub == s })
		close(s.done)
	}
}
