package tinymqwatermill

// How a message travels, and who owns what.
//
// A topic is the TinyMQ fanout exchange of that name. A consumer group is a
// queue bound to it, QueueName(topic, group), declared without a consumer
// (MQ.DeclareQueue), so that it keeps what is published while none of the
// group's subscriptions is open. A broadcast subscription (no group) has a
// queue of its own, declared when it opens and deleted when it closes, as an
// AMQP client's exclusive queue is.
//
// A dispatcher hands one queue's messages to the subscriptions attached to
// it: a group's, or one broadcast subscription's. While one is attached, it
// has a TinyMQ consumer on the queue (MQ.Consume), whose calls run on the
// queue's TinyMQ workers: each offers its message on handoff, where an idle
// subscription takes it, and waits for the watermill Ack or Nack. A Nack, or
// the subscription closing before it acked, makes the same call offer the
// message again, so that a redelivered message keeps its place in the order;
// with a retry policy (SubscriberConfig.Retry) a Nack instead ends the call
// with ErrNacked, and TinyMQ's retry timer, not a worker, holds the message
// until its next attempt.
//
// When a group's last subscription detaches, the dispatcher cancels its
// consumer (Subscription.Cancel): what its workers had taken and not begun
// goes back to the head of the queue. The messages already in its calls (at
// most the group's Concurrency) cannot go back, as TinyMQ has no requeue:
// those calls keep them and offer them to the group's next subscription
// first. With Concurrency 1 the dispatcher consumes again only once they are
// settled, so that the order holds across the gap. (One window remains: a
// worker that claimed its next message just before the Cancel begins it
// after, and TinyMQ does not say when that can no longer happen; should a
// subscription attach and a new consumer begin a later message before that
// call has counted itself in busy, the two are offered side by side. Nothing
// is lost.)
//
// When a broadcast subscription detaches, its queue is deleted, with what
// waits in it, and its consumer's call gives its message up (counted as
// removed); the dispatcher waits for that call.
//
// The dispatchers of groups live in a registry per MQ, so that the
// subscriptions of one group, from any Subscribers of the MQ, share one
// consumer and its order. The registry is found through a weak pointer to the
// MQ and forgotten when the MQ is garbage collected.
//
// Goroutines: one per subscription (subscription.run), started by
// Subscriber.Subscribe, ended by its context or Subscriber.Close, and joined by
// Subscriber.Close. Nothing else here starts a goroutine; the consumer calls
// run on TinyMQ's workers, which MQ.Stop joins.
//
// A consumer call never blocks for ever: while it waits for a subscription it
// polls every pollInterval whether the MQ is stopping (TinyMQ has no stop
// notification), and gives the message up with ErrNoSubscriber once it is.
//
// Locks, in the order they may be taken: registries.mu, registry.mu,
// dispatcher.mu (held while consuming and cancelling without waiting, which
// take TinyMQ's locks; TinyMQ calls nothing of the adapter under its locks).
// No lock is held while waiting on a channel or for a consumer call: a
// broadcast subscription's detach waits for its call with no lock, and a
// consumer call takes dispatcher.mu only as it ends (settled).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/tinymq/tinymq"
)

// pollInterval is how often a waiting consumer call asks whether the MQ is
// stopping.
const pollInterval = 100 * time.Millisecond

// probeQueue is a queue name nobody declares: pausing it fails with
// tinymq.ErrStopped once the MQ stops, and with tinymq.ErrUnknownQueue before,
// under the MQ's read lock and without reaching an engine.
const probeQueue = "\x00tinymqwatermill: stop probe"

// QueueName returns the name of the TinyMQ queue that holds topic's messages
// for a consumer group; use it to read the queue's depth in tinymq.MQ.Stats,
// or to delete a group that is no longer used (tinymq.MQ.DeleteQueue with
// tinymq.IfUnused). When group is "", it returns the prefix of the names of
// the topic's broadcast subscriptions' queues: each has its own, named
// QueueName(topic, "") followed by " #" and a number. It quotes both names,
// so that no two pairs share a queue.
func QueueName(topic, group string) string {
	if group == "" {
		return fmt.Sprintf("watermill %q", topic)
	}
	return fmt.Sprintf("watermill %q %q", topic, group)
}

// registries maps each MQ that has subscribers to its registry.
var registries = struct {
	mu sync.Mutex
	m  map[weak.Pointer[tinymq.MQ]]*registry
}{m: make(map[weak.Pointer[tinymq.MQ]]*registry)}

// registry holds the group dispatchers of one MQ. It must not reference the
// MQ, or the MQ would never be collected; a dispatcher references it only
// through its consumer, while a subscription is attached.
type registry struct {
	stopped    atomic.Bool   // sticky: the MQ was seen stopping
	broadcasts atomic.Uint64 // broadcast subscriptions so far: their queues' numbers

	mu          sync.Mutex
	dispatchers map[dispatcherKey]*dispatcher
}

type dispatcherKey struct{ topic, group string }

// registryOf returns mq's registry, making it on first use.
func registryOf(mq *tinymq.MQ) *registry {
	key := weak.Make(mq)
	registries.mu.Lock()
	defer registries.mu.Unlock()
	if r := registries.m[key]; r != nil {
		return r
	}
	r := &registry{dispatchers: make(map[dispatcherKey]*dispatcher)}
	registries.m[key] = r
	runtime.AddCleanup(mq, forgetRegistry, key)
	return r
}

func forgetRegistry(key weak.Pointer[tinymq.MQ]) {
	registries.mu.Lock()
	delete(registries.m, key)
	registries.mu.Unlock()
}

// stopping reports whether mq has begun to stop. It takes the MQ's read lock
// for a moment until it first returns true, and costs nothing after.
func (r *registry) stopping(mq *tinymq.MQ) bool {
	if r.stopped.Load() {
		return true
	}
	if errors.Is(mq.PauseQueue(probeQueue), tinymq.ErrStopped) {
		r.stopped.Store(true)
		return true
	}
	return false
}

// group returns the dispatcher of topic's group, whose queue the caller
// declared, making it with concurrency workers on first use (a later
// concurrency is ignored).
func (r *registry) group(topic, group string, concurrency int) *dispatcher {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := dispatcherKey{topic, group}
	d := r.dispatchers[k]
	if d == nil {
		d = &dispatcher{reg: r, topic: topic, queue: QueueName(topic, group), concurrency: concurrency,
			handoff: make(chan *delivery)}
		r.dispatchers[k] = d
	}
	return d
}

// broadcast returns a dispatcher for one broadcast subscription to topic,
// with a new queue name; the caller declares the queue.
func (r *registry) broadcast(topic string) *dispatcher {
	name := fmt.Sprintf("%s #%d", QueueName(topic, ""), r.broadcasts.Add(1))
	return &dispatcher{reg: r, topic: topic, queue: name, concurrency: 1, private: true,
		handoff: make(chan *delivery), gone: make(chan struct{})}
}

// dispatcher delivers the messages of one TinyMQ queue to the subscriptions
// attached to it.
type dispatcher struct {
	reg         *registry
	topic       string
	queue       string
	concurrency int
	private     bool // a broadcast subscription's: its queue goes when it detaches

	handoff   chan *delivery // where the consumer's calls offer a message and idle subscriptions take it
	gone      chan struct{}  // private only: closed once its subscription detached and the queue was deleted
	nackFails atomic.Bool    // a Nack fails the TinyMQ attempt (SubscriberConfig.Retry), rather than offering again
	attached  atomic.Int64   // subscriptions attached; written under mu
	busy      atomic.Int64   // consumer calls running, of this consumer or of one cancelled before

	mu  sync.Mutex
	sub *tinymq.Subscription // the consumer, while subscriptions are attached
}

// attach counts a subscription in, and gives d a consumer if it has none.
func (d *dispatcher) attach(mq *tinymq.MQ) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attached.Add(1)
	if err := d.consumeLocked(mq); err != nil {
		d.attached.Add(-1)
		return err
	}
	return nil
}

// consumeLocked gives d a consumer on its queue, unless it has one or no
// subscription is attached. With Concurrency 1 it waits until the calls of
// the consumer before are settled (see settled), so that the messages they
// hold go before the queue's. d.mu is held.
func (d *dispatcher) consumeLocked(mq *tinymq.MQ) error {
	if d.sub != nil || d.attached.Load() == 0 || (d.concurrency == 1 && d.busy.Load() > 0) {
		return nil
	}
	sub, err := mq.Consume(d.queue, func(ctx context.Context, m *tinymq.Msg) error {
		return d.compete(ctx, mq, m)
	}, d.concurrency)
	if err != nil {
		return fmt.Errorf("tinymqwatermill: subscribe to %q: %w", d.topic, err)
	}
	d.sub = sub
	return nil
}

// expired is a context that has ended: Cancel with it does not wait.
var expired = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// detach counts a subscription out. The last one of a group cancels the
// consumer without waiting for its calls, which keep their messages for the
// next subscription; a broadcast subscription's queue is deleted, and its
// consumer's call awaited.
func (d *dispatcher) detach(mq *tinymq.MQ) {
	if d.private {
		d.attached.Store(0)
		// The queue's waiting messages go with it, counted in
		// Stats().Deleted and logged; ErrStopped leaves them to Stop.
		_, _ = mq.DeleteQueue(d.queue)
		close(d.gone)
		if d.sub != nil {
			// Its call gives up once gone is closed; after Stop, Cancel
			// returns once the MQ's workers have.
			_ = d.sub.Cancel(context.Background())
		}
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.attached.Add(-1) > 0 || d.sub == nil {
		return
	}
	sub := d.sub
	d.sub = nil
	// What the workers took and did not begin goes back to the head of the
	// queue. The calls in flight wait for the next subscription, so waiting
	// for them here would wait for ever: expired makes Cancel return at once.
	_ = sub.Cancel(expired)
}

// settled ends a consumer call. The last call of a group's cancelled
// consumer to settle starts the next consumer if a subscription is waiting
// (see consumeLocked). It may consume from a TinyMQ worker: TinyMQ holds no
// lock while a consumer runs, and an error (the MQ stopping) only means that
// there is nothing more to deliver.
func (d *dispatcher) settled(mq *tinymq.MQ) {
	if d.busy.Add(-1) > 0 || d.private {
		return
	}
	d.mu.Lock()
	_ = d.consumeLocked(mq)
	d.mu.Unlock()
}

// outcome is how a subscription ended one delivery.
type outcome uint8

const (
	acked outcome = iota
	nacked
	returned // closed, or withdrawn, before an Ack or a Nack
)

// delivery is one TinyMQ message on its way to a subscription. It is offered
// again after a Nack; each offer taken gets exactly one reply.
type delivery struct {
	decoded
	ctx      context.Context // the TinyMQ consumer's
	withdraw chan struct{}   // closed once the MQ stops: give it back unless handed out
	result   chan outcome    // room for the one reply that may be outstanding
}

func newDelivery(ctx context.Context, m *tinymq.Msg) (*delivery, error) {
	dec, err := decode(m)
	if err != nil {
		return nil, err
	}
	return &delivery{decoded: dec, ctx: ctx, withdraw: make(chan struct{}), result: make(chan outcome, 1)}, nil
}

// compete is the consumer of d's queue: it hands the message to one idle
// subscription and returns once one acked it.
func (d *dispatcher) compete(ctx context.Context, mq *tinymq.MQ, m *tinymq.Msg) error {
	d.busy.Add(1)
	defer d.settled(mq)
	del, err := newDelivery(ctx, m)
	if err != nil {
		return err
	}
	w := waiter{mq: mq, reg: d.reg}
	defer w.release()
	for {
		if err := d.offer(ctx, &w, del); err != nil {
			return err
		}
		out, err := w.await(ctx, del)
		if err != nil {
			return err
		}
		switch {
		case out == acked:
			return nil
		case w.withdrawn:
			return fmt.Errorf("%w: the MQ stopped while message %s waited for a subscription to read it", ErrNoSubscriber, del.uuid)
		case out == nacked && d.nackFails.Load():
			return ErrNacked // TinyMQ retries it after its backoff, or dead-letters it
		case out == nacked && w.stopping():
			return fmt.Errorf("%w: message %s was nacked while the MQ stops", ErrNoSubscriber, del.uuid)
		}
		// Nacked, or its subscription closed: offer it again.
	}
}

// offer hands del to an idle subscription. It gives up with ErrNoSubscriber
// once a broadcast subscription's queue is gone, or while none is attached
// and the MQ stops.
func (d *dispatcher) offer(ctx context.Context, w *waiter, del *delivery) error {
	select {
	case d.handoff <- del:
		return nil
	default:
	}
	for {
		if d.attached.Load() == 0 && w.stopping() {
			return fmt.Errorf("%w: the MQ stopped while message %s had no subscription", ErrNoSubscriber, del.uuid)
		}
		select {
		case d.handoff <- del:
			return nil
		case <-d.gone: // nil, so never ready, for a group
			return fmt.Errorf("%w: the subscription to %q closed before it acked message %s", ErrNoSubscriber, d.topic, del.uuid)
		case <-ctx.Done():
			return ctx.Err()
		case <-w.tick():
		}
	}
}

// waiter is one consumer call's means to wait without blocking for ever: a
// timer it polls the MQ's state with.
type waiter struct {
	mq        *tinymq.MQ
	reg       *registry
	timer     *time.Timer
	probed    time.Time // when stopping last asked the MQ
	withdrawn bool      // the delivery's withdraw channel is closed
}

// tick returns a channel that receives pollInterval from now.
func (w *waiter) tick() <-chan time.Time {
	if w.timer == nil {
		w.timer = time.NewTimer(pollInterval)
	} else {
		w.timer.Reset(pollInterval)
	}
	return w.timer.C
}

func (w *waiter) release() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

// stopping reports whether the MQ has begun to stop, asking it at most once
// per pollInterval, so that a subscription nacking in a tight loop does not
// take the MQ's lock each time.
func (w *waiter) stopping() bool {
	if w.reg.stopped.Load() {
		return true
	}
	if now := time.Now(); now.Sub(w.probed) >= pollInterval {
		w.probed = now
		return w.reg.stopping(w.mq)
	}
	return false
}

// await returns the reply to del. Once the MQ stops, it withdraws del from
// a subscription that has not handed it to its reader yet (it replies
// returned); it keeps waiting for a handler that has it, as MQ.Stop waits for
// consumers.
func (w *waiter) await(ctx context.Context, del *delivery) (outcome, error) {
	for {
		var tick <-chan time.Time
		if !w.withdrawn {
			tick = w.tick()
		}
		select {
		case out := <-del.result:
			return out, nil
		case <-ctx.Done():
			return returned, ctx.Err()
		case <-tick:
			if w.stopping() {
				close(del.withdraw)
				w.withdrawn = true
			}
		}
	}
}
