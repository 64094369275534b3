package tinymqwatermill

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tinymq/tinymq"
)

// SubscriberConfig configures a Subscriber. The zero value subscribes without
// a consumer group, each subscription from an in-memory queue of its own with
// no limit, no TTL and no dead-lettering, where a Nack redelivers the message
// at once.
//
// The queue settings (Durable, MessageTTL, MaxLen, Overflow, Retry and
// DeadLetterTopic) are TinyMQ's queue options, given to the queue that
// Subscribe or SubscribeInitialize declares: a consumer group's queue, or
// each broadcast subscription's own. tinymq.MQ.Topology shows them in the
// queue's tinymq.QueueInfo. TinyMQ validates them: a value it refuses makes
// Subscribe and SubscribeInitialize return an error wrapping
// tinymq.ErrInvalidOption. Every Subscriber of one consumer group must give a
// topic the same settings: once the group's queue exists, Subscribe with
// others returns an error wrapping tinymq.ErrDuplicateQueue (delete the queue
// with tinymq.MQ.DeleteQueue to change them).
type SubscriberConfig struct {
	// ConsumerGroup names the TinyMQ queue this Subscriber's subscriptions to
	// a topic take messages from (see QueueName). Subscriptions of one group,
	// from any Subscribers of the same MQ, compete: each message goes to one
	// of them. Every group gets every message. The queue is declared by the
	// group's first Subscribe (or SubscribeInitialize) and lives as long as
	// the MQ, unless deleted with tinymq.MQ.DeleteQueue: messages published
	// while no subscription of the group is open wait in it for the next one.
	//
	// With no group, as with watermill's GoChannel, a subscription gets every
	// message published to the topic while it is open, from a queue of its
	// own that it deletes when it closes, so that a subscription that does not
	// read (a slow Router handler) holds back no other; the messages published
	// while nobody listens are dropped (see PublisherConfig.FailUnroutable).
	ConsumerGroup string

	// Concurrency is the number of TinyMQ workers of a consumer group's queue:
	// how many of the group's messages may be in subscriptions at once (each
	// subscription holds one at a time). Default 1, which delivers in publish
	// order when Retry is nil (a nacked message is redelivered before the
	// next one); above 1 there is no order. The first Subscriber of the MQ to
	// subscribe to the topic with the group sets it; later ones are ignored,
	// and so is it without a group (a broadcast queue has one worker).
	Concurrency int

	// Durable keeps the consumer group's queue and its messages in the MQ's
	// write-ahead log (tinymq.WithDurable), so that what the group had not
	// acked survives a crash or a restart: the MQ needs tinymq.WithDataDir
	// (otherwise Subscribe returns an error wrapping tinymq.ErrInvalidOption),
	// a Publish to the topic returns once the message is on disk (see
	// tinymq.WithSync), and after the next MQ.Start the group's first
	// Subscribe or SubscribeInitialize restores the queue's messages. It needs
	// a ConsumerGroup (NewSubscriber refuses it without one): a broadcast
	// subscription's queue goes when the subscription closes.
	Durable bool

	// MessageTTL, when positive, is how long a message may wait in the queue
	// (tinymq.WithMessageTTL), counted from when it reaches the queue: one still
	// waiting then is never delivered, and is dead-lettered with reason
	// tinymq.ReasonExpired (see DeadLetterTopic). Default 0: no limit.
	MessageTTL time.Duration

	// MaxLen, when positive, bounds the queue to that many messages
	// (tinymq.WithMaxLen), counting those waiting for their turn or for a
	// retry, but not the ones in subscriptions. Default 0: unbounded.
	MaxLen int

	// Overflow says what a Publish to the topic does when the queue holds
	// MaxLen messages: tinymq.DropHead (the default) dead-letters the oldest
	// waiting one with reason tinymq.ReasonMaxLen (see DeadLetterTopic),
	// tinymq.RejectPublish makes Publish return an error wrapping
	// tinymq.ErrQueueFull, and tinymq.Block makes Publish wait for room until
	// the message's context ends. NewSubscriber refuses it without MaxLen.
	Overflow tinymq.Overflow

	// Retry, when set, is the queue's retry policy (tinymq.WithRetry): a Nack
	// (a Router handler's error) ends the delivery as a failed attempt, with
	// ErrNacked, and the message waits in TinyMQ, on a timer, for the policy's
	// backoff while the queue delivers the messages behind it, so retries
	// reorder the queue. Once it has had MaxAttempts deliveries it is
	// dead-lettered with reason tinymq.ReasonRejected (see DeadLetterTopic).
	// Zero fields take TinyMQ's defaults: &tinymq.RetryPolicy{} is 3 attempts,
	// 100 ms apart and doubling. Unlike watermill's Retry middleware, no
	// handler and no queue worker is held while a message waits.
	//
	// Default nil: a Nack redelivers the message at once, to the same
	// subscription, before any later message, for as long as it is nacked.
	// Order holds, but a message that always fails holds its queue back.
	Retry *tinymq.RetryPolicy

	// DeadLetterTopic, when set, is the topic the queue's dead messages are
	// published to (tinymq.WithDeadLetter): those that used up their Retry
	// attempts, expired (MessageTTL) or were dropped from a full queue
	// (MaxLen with tinymq.DropHead). A dead letter keeps its UUID, payload
	// and metadata, and a Subscriber gives it the metadata DeathReasonKey,
	// DeathTopicKey, DeathQueueKey and DeathAttemptsKey. The topic need not
	// exist yet: the queues bound to it when a message dies get the dead
	// letter (SubscribeInitialize a consumer group on it to keep them); with
	// none, TinyMQ drops it, counts it in tinymq.QueueStats.Dropped and logs
	// it. It must not be the subscribed topic (Subscribe returns an error
	// wrapping tinymq.ErrInvalidOption). Default "": dead messages are
	// dropped, counted and logged.
	DeadLetterTopic string
}

// queueOptions returns the TinyMQ options of the queue that cfg configures.
func (cfg *SubscriberConfig) queueOptions() []tinymq.QueueOption {
	var opts []tinymq.QueueOption
	if cfg.Durable {
		opts = append(opts, tinymq.WithDurable())
	}
	if cfg.MessageTTL != 0 {
		opts = append(opts, tinymq.WithMessageTTL(cfg.MessageTTL))
	}
	if cfg.MaxLen != 0 {
		opts = append(opts, tinymq.WithMaxLen(cfg.MaxLen, cfg.Overflow))
	}
	if cfg.Retry != nil {
		opts = append(opts, tinymq.WithRetry(*cfg.Retry))
	}
	if cfg.DeadLetterTopic != "" {
		opts = append(opts, tinymq.WithDeadLetter(cfg.DeadLetterTopic, ""))
	}
	return opts
}

// Subscriber is a watermill message.Subscriber that consumes from a TinyMQ MQ.
// Create it with NewSubscriber; it is safe for concurrent use. Each
// subscription has one goroutine, which Close joins.
//
// A consumer group's message is handed to one subscription of the group, a
// broadcast message to every open subscription of its topic. A Nack
// redelivers it to the same subscription before any later message, or, with
// SubscriberConfig.Retry, after TinyMQ's backoff; a group subscription that
// closes before its Ack leaves the message to another one of the group, or to
// the group's next subscription. Delivery is at least once, and ordered with
// the default Concurrency and no Retry.
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
// ErrNilMQ for a nil mq, and an error wrapping tinymq.ErrInvalidOption for a
// negative Concurrency, Durable without a ConsumerGroup, or Overflow without
// MaxLen; TinyMQ validates the other queue settings when Subscribe declares
// the queue. It copies cfg.Retry.
func NewSubscriber(mq *tinymq.MQ, cfg SubscriberConfig) (*Subscriber, error) {
	if mq == nil {
		return nil, ErrNilMQ
	}
	switch {
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("%w: Concurrency %d", tinymq.ErrInvalidOption, cfg.Concurrency)
	case cfg.Durable && cfg.ConsumerGroup == "":
		return nil, fmt.Errorf("%w: Durable needs a ConsumerGroup (a broadcast subscription's queue is deleted when it closes)", tinymq.ErrInvalidOption)
	case cfg.Overflow != 0 && cfg.MaxLen == 0:
		return nil, fmt.Errorf("%w: Overflow without MaxLen", tinymq.ErrInvalidOption)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.MaxLen != 0 && cfg.Overflow == 0 {
		cfg.Overflow = tinymq.DropHead
	}
	if cfg.Retry != nil {
		retry := *cfg.Retry // the caller may change theirs
		cfg.Retry = &retry
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
// already has the name) or the queue's settings are refused (see
// SubscriberConfig).
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
	if err := s.declare(d.queue, topic); err != nil {
		return nil, fmt.Errorf("tinymqwatermill: subscribe to %q: %w", topic, err)
	}
	d.nackFails.Store(s.cfg.Retry != nil) // the queue's settings are s.cfg's: the declare checked them
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

// SubscribeInitialize declares the consumer group's queue on topic, with the
// Subscriber's queue settings, so that the messages published from now on
// wait for the group's first subscription (and a Durable queue gets back its
// messages from the log);
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
		err = s.declare(QueueName(topic, s.cfg.ConsumerGroup), topic)
	}
	if err != nil {
		return fmt.Errorf("tinymqwatermill: initialize %q: %w", topic, err)
	}
	return nil
}

// declare declares the queue name bound to topic with the settings of s.cfg.
func (s *Subscriber) declare(name, topic string) error {
	if s.cfg.DeadLetterTopic != "" && s.cfg.DeadLetterTopic == topic {
		return fmt.Errorf("%w: DeadLetterTopic %q is the subscribed topic", tinymq.ErrInvalidOption, topic)
	}
	return s.mq.DeclareQueue(name, topic, tinymq.Fanout, s.cfg.queueOptions()...)
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
