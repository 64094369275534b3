package tinymqwatermill

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tinymq/tinymq"
)

// SubscriberConfig configures a Subscriber. The zero value subscribes without
// a consumer group.
type SubscriberConfig struct {
	// ConsumerGroup names the TinyMQ queue this Subscriber's subscriptions to
	// a topic take messages from (see QueueName). Subscriptions of one group,
	// from any Subscribers of the same MQ, compete: each message goes to one
	// of them. Every group gets every message. The queue is declared by the
	// group's first Subscribe (or SubscribeInitialize) and lives as long as
	// the MQ, unless deleted with tinymq.MQ.DeleteQueue: messages published
	// while no subscription of the group is open wait in it for the next one.
	//
	// With no group, a subscription gets every message published to the topic
	// while it is open, from a queue of its own that it deletes when it
	// closes; the messages published while nobody listens are dropped (see
	// PublisherConfig.FailUnroutable).
	ConsumerGroup string

	// Concurrency is the number of TinyMQ workers of a consumer group's queue:
	// how many of the group's messages may be in subscriptions at once.
	// Default 1, which delivers in publish order (a nacked message is
	// redelivered before the next one); above 1 there is no order. The first
	// Subscriber of the MQ to subscribe to the topic with the group sets it;
	// later ones are ignored, and so is it without a group.
	Concurrency int
}

// Subscriber is a watermill message.Subscriber that consumes from a TinyMQ MQ.
// Create it with NewSubscriber; it is safe for concurrent use. Each
// subscription has one goroutine, which Close joins.
//
// A consumer group's message is handed to one subscription of the group, a
// broadcast message to every open subscription of its topic. A Nack
// redelivers it to the same subscription before any later message; a group
// subscription that closes before its Ack leaves the message to another one
// of the group, or to the group's next subscription. Delivery is at least
// once, and ordered with the default Concurrency.
type Subscriber struct {
	mq      *tinymq.MQ
	reg     *registry
	cfg     SubscriberConfig
	closing context.Context // cancelled by Close
	cancel  context.CancelFunc

	mu     sync.Mutex // guards closed and wg.Add
	closed bool
	wg     sync.WaitGroup // one per subscription goroutine
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber returns a Subscriber to mq. It does not block and works
// whatever the MQ's state (see Subscribe for a stopped MQ). It returns
// ErrNilMQ for a nil mq and an error wrapping tinymq.ErrInvalidOption for a
// negative Concurrency.
func NewSubscriber(mq *tinymq.MQ, cfg SubscriberConfig) (*Subscriber, error) {
	if mq == nil {
		return nil, ErrNilMQ
	}
	if cfg.Concurrency < 0 {
		return nil, fmt.Errorf("%w: Concurrency %d", tinymq.ErrInvalidOption, cfg.Concurrency)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	s := &Subscriber{mq: mq, reg: registryOf(mq), cfg: cfg}
	s.closing, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Subscribe returns a channel of the messages published to topic, and the
// messages of the consumer group's queue published before, if the queue
// exists. The channel is unbuffered: the next message comes after the reader
// acked or nacked the one before. Each message's context ends when the
// message is acked or nacked, when the subscription ends, or when the MQ's
// consumers' context does (MQ.Shutdown); it carries ctx's values.
//
// The subscription ends, and the channel is closed, when ctx is cancelled or
// the Subscriber closed: its TinyMQ consumer is cancelled
// (tinymq.Subscription.Cancel). A group subscription leaves what it had not
// acked to the group: the messages its consumer had not begun go back to the
// head of the queue, and a message it held, or was about to be handed, goes
// to another subscription of the group, or first to the group's next one. A
// broadcast subscription's queue is deleted, with the messages still in it
// for that subscription (counted in tinymq.Stats.Deleted and logged).
//
// Subscribe does not block on consumers. It may be called before the MQ
// starts (messages flow from MQ.Start). It returns ErrClosed after Close, an
// error wrapping tinymq.ErrStopped once the MQ stops, and TinyMQ's error when
// the topic cannot be a fanout exchange (empty, or another kind of exchange
// already has the name).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", tinymq.ErrInvalidOption)
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	var d *dispatcher
	if s.cfg.ConsumerGroup == "" {
		d = s.reg.broadcast(topic)
	} else {
		d = s.reg.group(topic, s.cfg.ConsumerGroup, s.cfg.Concurrency)
	}
	if err := s.mq.DeclareQueue(d.queue, topic, tinymq.Fanout); err != nil {
		return nil, fmt.Errorf("tinymqwatermill: subscribe to %q: %w", topic, err)
	}
	sub := &subscription{d: d, mq: s.mq, out: make(chan *message.Message)}
	sub.ctx, sub.cancel = context.WithCancel(ctx)
	sub.stopAfter = context.AfterFunc(s.closing, sub.cancel)

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sub.end()
		return nil, ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	if err := d.attach(s.mq); err != nil {
		sub.end()
		s.wg.Done()
		return nil, err
	}
	go sub.run(&s.wg)
	return sub.out, nil
}

// SubscribeInitialize declares the consumer group's queue on topic, so that
// the messages published from now on wait for the group's first subscription;
// without a group it only declares the topic's exchange. It does not block,
// and returns the errors Subscribe returns.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := s.check(); err != nil {
		return err
	}
	var err error
	if s.cfg.ConsumerGroup == "" {
		err = s.mq.DeclareExchange(topic, tinymq.Fanout)
	} else {
		err = s.mq.DeclareQueue(QueueName(topic, s.cfg.ConsumerGroup), topic, tinymq.Fanout)
	}
	if err != nil {
		return fmt.Errorf("tinymqwatermill: initialize %q: %w", topic, err)
	}
	return nil
}

// check returns ErrClosed after Close.
func (s *Subscriber) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Close ends every subscription, closes their channels and waits for their
// goroutines; a group subscription leaves what it had not acked to the group
// (see Subscribe). Later calls to Subscribe return ErrClosed. It does not
// stop the MQ, and the queues of consumer groups keep their messages. Close
// blocks only until the subscriptions' goroutines return, which they do at
// once, before or after the MQ stops. It is idempotent and safe to call
// concurrently: every call returns once all subscriptions have ended. It
// always returns nil.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// subscription is one Subscribe call: a goroutine taking deliveries from its
// dispatcher and handing them to the reader of out.
type subscription struct {
	d         *dispatcher
	mq        *tinymq.MQ
	ctx       context.Context // Subscribe's ctx, also cancelled by Subscriber.Close
	cancel    context.CancelFunc
	stopAfter func() bool
	out       chan *message.Message
}

// end releases the contexts of a subscription that never ran, and deletes a
// broadcast subscription's queue.
func (s *subscription) end() {
	s.stopAfter()
	s.cancel()
	if s.d.private {
		_, _ = s.mq.DeleteQueue(s.d.queue)
	}
}

func (s *subscription) run(wg *sync.WaitGroup) {
	defer func() {
		s.stopAfter()
		s.cancel()
		s.d.detach(s.mq) // no consumer call sends to s after this
		close(s.out)
		wg.Done()
	}()
	for {
		select {
		case <-s.ctx.Done():
			return
		case del := <-s.d.handoff:
			if !s.deliver(del) {
				return
			}
		}
	}
}

// deliver hands del to the reader and replies how it ended. It returns false
// when the subscription has ended.
func (s *subscription) deliver(del *delivery) bool {
	if s.ctx.Err() != nil {
		del.result <- returned
		return false
	}
	msg := del.message()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel() // after the Ack, as watermill's GoChannel does
	stop := context.AfterFunc(del.ctx, cancel)
	defer stop()
	msg.SetContext(ctx)

	select {
	case s.out <- msg:
	case <-s.ctx.Done():
		del.result <- returned
		return false
	case <-del.withdraw:
		del.result <- returned
		return true
	case <-del.ctx.Done():
		del.result <- returned
		return true
	}
	select {
	case <-msg.Acked():
		del.result <- acked
	case <-msg.Nacked():
		del.result <- nacked
	case <-s.ctx.Done():
		del.result <- settled(msg)
		return false
	case <-del.ctx.Done():
		del.result <- settled(msg)
	}
	return true
}

// settled reports an Ack or a Nack that raced with the end of the wait.
func settled(msg *message.Message) outcome {
	select {
	case <-msg.Acked():
		return acked
	case <-msg.Nacked():
		return nacked
	default:
		return returned
	}
}
