package tinymqwatermill

// How a message travels, and who owns what.
//
// A topic is the TinyMQ fanout exchange of that name. Each (topic, consumer
// group) pair has one TinyMQ queue bound to it, and each topic one more queue
// for the subscriptions without a group (broadcast). A dispatcher owns one such
// queue: its consumer runs on the queue's TinyMQ workers and hands each message
// to a subscription, then waits for the watermill Ack or Nack. Nack, or a
// subscription closing before it acked, makes the same consumer call offer the
// message again, so that a redelivered message keeps its place in the order.
//
// The dispatchers of one MQ live in its registry, so that several Subscribers
// of one MQ share a group's queue: TinyMQ can neither look up a queue's
// consumer nor attach a second one. The registry is found through a weak
// pointer to the MQ and forgotten when the MQ is garbage collected.
//
// Goroutines: one per subscription (subscription.run), started by
// Subscriber.Subscribe, ended by its context or Subscriber.Close, and joined by
// Subscriber.Close. Nothing else here starts a goroutine; the consumers run on
// TinyMQ's workers, which MQ.Stop joins.
//
// A consumer never blocks for ever: while no subscription is attached it parks,
// polling every pollInterval whether the MQ is stopping (TinyMQ has no stop
// notification), and drops the message with ErrNoSubscriber once it is.
//
// Locks, in the order they may be taken: registries.mu, registry.mu (held while
// registering a queue, which takes TinyMQ's registry lock), dispatcher.mu. No
// lock is held while waiting on a channel, and the broadcast filter takes none.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/tinymq/tinymq"
)

// pollInterval is how often a parked consumer asks whether the MQ is stopping.
const pollInterval = 100 * time.Millisecond

// probeQueue is a queue name nobody registers: binding it fails with
// tinymq.ErrStopped once the MQ stops, and with tinymq.ErrUnknownQueue before,
// without reaching an engine. (Publishing to an unknown exchange would tell
// the same in memory, but an engine would send it to its broker.)
const probeQueue = "\x00tinymqwatermill: stop probe"

// QueueName returns the name of the TinyMQ queue that holds topic's messages
// for a consumer group, or, when group is "", for the topic's broadcast
// subscriptions; use it to read the queue's depth in tinymq.MQ.Stats. It
// quotes both names, so that no two pairs share a queue.
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

// registry holds the dispatchers of one MQ. It must not reference the MQ, or
// the MQ would never be collected.
type registry struct {
	stopped atomic.Bool // sticky: the MQ was seen stopping

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

// stopping reports whether mq has begun to stop. It takes the MQ's write lock
// for a moment until it first returns true, and costs nothing after.
func (r *registry) stopping(mq *tinymq.MQ) bool {
	if r.stopped.Load() {
		return true
	}
	if errors.Is(mq.Bind(probeQueue, probeQueue, tinymq.Fanout), tinymq.ErrStopped) {
		r.stopped.Store(true)
		return true
	}
	return false
}

// dispatcher returns the dispatcher of topic and group, registering its queue
// with concurrency workers on first use (a later concurrency is ignored).
func (r *registry) dispatcher(mq *tinymq.MQ, topic, group string, concurrency int) (*dispatcher, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := dispatcherKey{topic, group}
	if d := r.dispatchers[k]; d != nil {
		return d, nil
	}
	d := &dispatcher{reg: r, topic: topic, group: group}
	var err error
	if group == "" {
		// One worker: a broadcast message goes to every subscription at once.
		// The filter keeps the queue empty while nobody listens, as a
		// broadcast subscription gets only what is published while it is open.
		err = mq.RegisterQueue(topic, tinymq.Fanout,
			func(ctx context.Context, m *tinymq.Msg) error { return d.broadcast(ctx, mq, m) }, 1,
			tinymq.WithQueueName(QueueName(topic, "")),
			tinymq.WithFilter(func(*tinymq.Msg) bool { return d.attached.Load() > 0 }))
	} else {
		d.handoff = make(chan *delivery)
		err = mq.RegisterQueue(topic, tinymq.Fanout,
			func(ctx context.Context, m *tinymq.Msg) error { return d.compete(ctx, mq, m) }, concurrency,
			tinymq.WithQueueName(QueueName(topic, group)))
	}
	if err != nil {
		return nil, fmt.Errorf("tinymqwatermill: subscribe to %q: %w", topic, err)
	}
	r.dispatchers[k] = d
	return d, nil
}

// dispatcher delivers the messages of one TinyMQ queue to the subscriptions
// attached to it.
type dispatcher struct {
	reg   *registry
	topic string
	group string // "" for the broadcast queue

	// handoff (consumer groups only) is where the queue's consumers offer a
	// message and the group's idle subscriptions take it.
	handoff  chan *delivery
	attached atomic.Int64 // subscriptions attached

	mu   sync.Mutex
	subs []*subscription // broadcast only: the subscriptions attached
}

func (d *dispatcher) attach(s *subscription) {
	if d.group == "" {
		d.mu.Lock()
		d.subs = append(d.subs, s)
		d.mu.Unlock()
	}
	d.attached.Add(1)
}

func (d *dispatcher) detach(s *subscription) {
	d.attached.Add(-1)
	if d.group == "" {
		d.mu.Lock()
		d.subs = slices.DeleteFunc(d.subs, func(x *subscription) bool { return x == s })
		d.mu.Unlock()
	}
}

// source is the channel a subscription takes its deliveries from.
func (d *dispatcher) source(s *subscription) <-chan *delivery {
	if d.group == "" {
		return s.inbox
	}
	return d.handoff
}

// outcome is how a subscription ended one delivery.
type outcome uint8

const (
	acked outcome = iota
	nacked
	returned // closed, or withdrawn, before an Ack or a Nack
)

type reply struct {
	sub *subscription
	out outcome
}

// delivery is one TinyMQ message on its way to subscriptions. It is offered
// again after a Nack; each offer taken gets exactly one reply.
type delivery struct {
	decoded
	ctx      context.Context // the TinyMQ consumer's
	withdraw chan struct{}   // closed once the MQ stops: give it back unless handed out
	result   chan reply      // room for every reply that may be outstanding
}

func newDelivery(ctx context.Context, m *tinymq.Msg, subs int) (*delivery, error) {
	dec, err := decode(m)
	if err != nil {
		return nil, err
	}
	return &delivery{decoded: dec, ctx: ctx, withdraw: make(chan struct{}), result: make(chan reply, subs)}, nil
}

// compete is the consumer of a consumer group's queue: it hands the message to
// one idle subscription of the group and returns once one acked it.
func (d *dispatcher) compete(ctx context.Context, mq *tinymq.MQ, m *tinymq.Msg) error {
	del, err := newDelivery(ctx, m, 1)
	if err != nil {
		return err
	}
	w := waiter{mq: mq, reg: d.reg}
	defer w.release()
	for {
		if err := d.offer(ctx, &w, del); err != nil {
			return err
		}
		r, err := w.await(ctx, del)
		if err != nil {
			return err
		}
		switch {
		case r.out == acked:
			return nil
		case w.withdrawn:
			return fmt.Errorf("%w: the MQ stopped while message %s waited for a subscription to read it", ErrNoSubscriber, del.uuid)
		case r.out == nacked && w.stopping():
			return fmt.Errorf("%w: message %s was nacked while the MQ stops", ErrNoSubscriber, del.uuid)
		}
		// Nacked, or its subscription closed: offer it again.
	}
}

// offer hands del to an idle subscription of the group. While none is
// attached and the MQ stops, it gives up with ErrNoSubscriber.
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
		case <-ctx.Done():
			return ctx.Err()
		case <-w.tick():
		}
	}
}

// broadcast is the consumer of a topic's broadcast queue: it hands the message
// to every subscription attached now and returns once each acked it or closed.
func (d *dispatcher) broadcast(ctx context.Context, mq *tinymq.MQ, m *tinymq.Msg) error {
	d.mu.Lock()
	subs := slices.Clone(d.subs)
	d.mu.Unlock()
	if len(subs) == 0 {
		return fmt.Errorf("%w: every subscription to %q closed before the message reached it", ErrNoSubscriber, d.topic)
	}
	del, err := newDelivery(ctx, m, len(subs))
	if err != nil {
		return err
	}
	w := waiter{mq: mq, reg: d.reg}
	defer w.release()
	outstanding, lost := 0, 0
	for _, s := range subs {
		taken, err := offerTo(ctx, s, del)
		if err != nil {
			return err
		}
		if taken {
			outstanding++
		}
	}
	for outstanding > 0 {
		r, err := w.await(ctx, del)
		if err != nil {
			return err
		}
		outstanding--
		switch {
		case r.out == acked:
		case w.withdrawn, r.out == nacked && w.stopping():
			lost++
		case r.out == nacked:
			taken, err := offerTo(ctx, r.sub, del)
			if err != nil {
				return err
			}
			if taken {
				outstanding++
			}
		}
		// returned without a withdrawal: the subscription closed, and its copy
		// went with it.
	}
	if lost > 0 {
		return fmt.Errorf("%w: the MQ stopped before %d subscriptions to %q acked message %s", ErrNoSubscriber, lost, d.topic, del.uuid)
	}
	return nil
}

// offerTo hands del to one broadcast subscription, which is idle or about to
// be; it reports false when the subscription has ended.
func offerTo(ctx context.Context, s *subscription, del *delivery) (bool, error) {
	select {
	case s.inbox <- del:
		return true, nil
	case <-s.done:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
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

// await returns the next reply to del. Once the MQ stops, it withdraws del
// from subscriptions that have not handed it to their reader yet (they reply
// returned); it keeps waiting for a handler that has it, as MQ.Stop waits for
// consumers.
func (w *waiter) await(ctx context.Context, del *delivery) (reply, error) {
	for {
		var tick <-chan time.Time
		if !w.withdrawn {
			tick = w.tick()
		}
		select {
		case r := <-del.result:
			return r, nil
		case <-ctx.Done():
			return reply{}, ctx.Err()
		case <-tick:
			if w.stopping() {
				close(del.withdraw)
				w.withdrawn = true
			}
		}
	}
}
