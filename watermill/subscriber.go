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
	// a topic take messages from. Subscriptions of one group, from any
	// Subscribers of the same MQ, compete: each message goes to one of them.
	// Every group gets every message. The queue lives as long as the MQ:
	// messages published while no subscription of the group is open wait for
	// the next one (see SubscribeInitialize).
	//
	// With no group, a subscription gets every message published to the topic
	// while it is open, and the messages published while nobody listens are
	// dropped (see PublisherConfig.FailUnroutable).
	ConsumerGroup string

	// Concurrency is the number of TinyMQ workers of a consumer group's queue:
	// how many of the group's messages may be in subscriptions at once.
	// Default 1, which delivers in publish order (a nacked message is
	// redelivered before the next one); above 1 there is no order. It applies
	// when this Subscriber creates the group's queue on the topic, and is
	// ignored when the queue exists already, and without a group.
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
// of the group. Delivery is at least once, and ordered with the default
// Concurrency.
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
// the Subscriber closed; a message it held unacked then goes to another
// subscription of the group (without a group, it goes with it). Subscribe does not block on consumers. It may be called
// before the MQ starts (messages flow from MQ.Start). It returns ErrClosed
// after Close, an error wrapping tinymq.ErrStopped once the MQ stops, and
// TinyMQ's error when the topic cannot be a fanout exchange (empty, or another
// kind of exchange already has the name).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", tinymq.ErrInvalidOption)
	}
	d, err := s.dispatcher(topic)
	if err != nil {
		return nil, err
	}
	sub := &subscription{d: d, out: make(chan *message.Message), done: make(chan struct{})}
	if d.group == "" {
		sub.inbox = make(chan *delivery)
	}
	sub.ctx, sub.cancel = context.WithCancel(ctx)
	sub.stopAfter = context.AfterFunc(s.closing, sub.cancel)

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sub.stopAfter()
		sub.cancel()
		return nil, ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	d.attach(sub)
	go sub.run(&s.wg)
	return sub.out, nil
}

// SubscribeInitialize creates the consumer group's queue on topic, so that
// the messages published from now on wait for the group's first subscription;
// without a group it only declares the topic's exchange. It does not block,
// and returns the errors Subscribe returns.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if s.cfg.ConsumerGroup == "" {
		if err := s.check(); err != nil {
			return err
		}
		if err := s.mq.DeclareExchange(topic, tinymq.Fanout); err != nil {
			return fmt.Errorf("tinymqwatermill: initialize %q: %w", topic, err)
		}
		return nil
	}
	_, err := s.dispatcher(topic)
	return err
}

// check returns ErrClosed after Close, and tinymq.ErrStopped once the MQ stops.
func (s *Subscriber) check() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if s.reg.stopping(s.mq) {
		return fmt.Errorf("tinymqwatermill: subscribe: %w", tinymq.ErrStopped)
	}
	return nil
}

// dispatcher returns the dispatcher of topic for this Subscriber's group.
func (s *Subscriber) dispatcher(topic string) (*dispatcher, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.reg.dispatcher(s.mq, topic, s.cfg.ConsumerGroup, s.cfg.Concurrency)
}

// Close ends every subscription, closes their channels and waits for their
// goroutines; a message a group subscription held unacked goes back to the
// group. Later calls to Subscribe return ErrClosed. It does not
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
	ctx       context.Context // Subscribe's ctx, also cancelled by Subscriber.Close
	cancel    context.CancelFunc
	stopAfter func() bool
	out       chan *message.Message
	inbox     chan *delivery // broadcast: where the dispatcher offers deliveries
	done      chan struct{}  // closed when run returns
}

func (s *subscription) run(wg *sync.WaitGroup) {
	defer func() {
		s.d.detach(s)
		s.stopAfter()
		s.cancel()
		close(s.done)
		close(s.out)
		wg.Done()
	}()
	src := s.d.source(s)
	for {
		select {
		case <-s.ctx.Done():
			return
		case del := <-src:
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
		del.result <- reply{s, returned}
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
		del.result <- reply{s, returned}
		return false
	case <-del.withdraw:
		del.result <- reply{s, returned}
		return true
	case <-del.ctx.Done():
		del.result <- reply{s, returned}
		return true
	}
	select {
	case <-msg.Acked():
		del.result <- reply{s, acked}
	case <-msg.Nacked():
		del.result <- reply{s, nacked}
	case <-s.ctx.Done():
		del.result <- reply{s, settled(msg)}
		return false
	case <-del.ctx.Done():
		del.result <- reply{s, settled(msg)}
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
