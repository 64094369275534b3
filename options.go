package tinymq

import (
	"fmt"
	"time"
)

// QueueOption configures a queue in [MQ.RegisterQueue].
type QueueOption interface {
	applyQueue(*queueConfig) error
}

// BindingOption configures a binding: in [MQ.RegisterQueue], where every
// BindingOption is also a QueueOption, and in [MQ.Bind], which takes nothing
// else.
type BindingOption interface {
	QueueOption
	applyBinding(*binding) error
}

// queueConfig is what the options of RegisterQueue ask for.
type queueConfig struct {
	name     string
	filter   func(*Msg) bool
	binding  binding
	retry    RetryPolicy
	ttl      time.Duration
	maxLen   int
	overflow Overflow
	dlx      string
	dlxKey   string
	durable  bool
}

type queueOptionFunc func(*queueConfig) error

func (f queueOptionFunc) applyQueue(c *queueConfig) error { return f(c) }

type bindingOptionFunc func(*binding) error

func (f bindingOptionFunc) applyQueue(c *queueConfig) error { return f(&c.binding) }
func (f bindingOptionFunc) applyBinding(b *binding) error   { return f(b) }

// WithQueueName names the queue; names are unique within an MQ and appear in logs
// and in [Msg.Queue]. By default a queue is named after its exchange and its
// registration number, as "events#3".
func WithQueueName(name string) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if name == "" {
			return fmt.Errorf("%w: queue name", ErrEmptyName)
		}
		c.name = name
		return nil
	})
}

// WithBindingKey binds the queue with key: the exact routing key on a direct
// exchange, a pattern on a topic exchange. Give it several times to bind one
// queue with several keys; a message that matches several of them is still
// delivered to the queue once. Direct and topic queues need at least one;
// fanout and headers exchanges take none.
func WithBindingKey(key string) BindingOption {
	return bindingOptionFunc(func(b *binding) error {
		b.keys = append(b.keys, key)
		return nil
	})
}

// WithBindingArgs binds the queue to a headers exchange with AMQP binding
// arguments: "x-match" ("all", the default, "any", "all-with-x" or "any-with-x")
// and the header values to match; a nil value matches any value of that header.
// Give it several times for several bindings; a message matching any of them is
// delivered to the queue once. Only headers exchanges take it. The arguments
// obey the limits of [WithHeaders] on values, depth and size.
func WithBindingArgs(args map[string]any) BindingOption {
	return bindingOptionFunc(func(b *binding) error {
		b.args = append(b.args, args)
		b.hasArgs = true
		return nil
	})
}

// WithFilter drops, at publish time, the messages for which keep returns false,
// after the binding has matched. keep runs on the publisher's goroutine with the
// queue's copy of the message; it must be fast and safe for concurrent use. A
// message that every matching queue filters out is unroutable. A panic in keep
// makes Publish return an error wrapping a [*PanicError].
func WithFilter(keep func(*Msg) bool) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if keep == nil {
			return fmt.Errorf("%w: nil filter", ErrInvalidOption)
		}
		c.filter = keep
		return nil
	})
}

// queueOptions applies the options of RegisterQueue and validates the
// binding they ask of an exchange of the given kind.
func queueOptions(kind ExchangeType, opts []QueueOption) (queueConfig, []headersBinding, error) {
	var c queueConfig
	for _, o := range opts {
		if o == nil {
			return c, nil, fmt.Errorf("%w: nil QueueOption", ErrInvalidOption)
		}
		if err := o.applyQueue(&c); err != nil {
			return c, nil, err
		}
	}
	hbs, err := checkBinding(kind, c.binding)
	return c, hbs, err
}

// bindingOptions applies the options of Bind and validates the binding.
func bindingOptions(kind ExchangeType, opts []BindingOption) (binding, []headersBinding, error) {
	var b binding
	for _, o := range opts {
		if o == nil {
			return b, nil, fmt.Errorf("%w: nil BindingOption", ErrInvalidOption)
		}
		if err := o.applyBinding(&b); err != nil {
			return b, nil, err
		}
	}
	hbs, err := checkBinding(kind, b)
	return b, hbs, err
}

// Option configures an MQ in [New].
type Option interface {
	applyMQ(*MQ)
}

type optionFunc func(*MQ)

func (f optionFunc) applyMQ(m *MQ) { f(m) }

// defaultMaxMessageSize is the default of WithMaxMessageSize: what a record
// of the write-ahead log holds (1 GiB, internal/wal's maxBodyLen), less room
// for the rest of the record (headers, at most about 2 MiB, routing key,
// deaths, queue names).
const defaultMaxMessageSize = 1<<30 - 4<<20

// WithMaxMessageSize limits the size of the messages the MQ accepts to n
// bytes, as RabbitMQ's max_message_size does; Publish refuses a larger one
// with an error wrapping [ErrTooLarge], and no queue gets it. The size of a
// message is the length of its Data when that is a []byte, a string, a
// json.RawMessage or an [Encoded] (its Body), checked before anything else
// for every publish, in-memory queues included; and, for a message that a
// durable queue stores, also the length of its encoding by the [Codec],
// checked before it is copied or written (a []byte encoded by [JSONCodec]
// before it is encoded at all). Other values bound for in-memory queues are
// never encoded and have no size to limit.
//
// The default, and the most a durable queue stores whatever n says, is
// 1020 MiB: what a record of the log holds, less room for the message's
// headers and routing. A zero or negative n means the default.
func WithMaxMessageSize(n int) Option {
	return optionFunc(func(m *MQ) { m.maxSize = max(n, 0) })
}

// maxMessageSize is the limit of WithMaxMessageSize.
func (m *MQ) maxMessageSize() int {
	if m.maxSize == 0 {
		return defaultMaxMessageSize
	}
	return m.maxSize
}

// checkSize refuses data whose size, known without encoding it, is over the
// limit of WithMaxMessageSize.
func (m *MQ) checkSize(data any) error {
	if n, ok := dataSize(data); ok && n > m.maxMessageSize() {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, n, m.maxMessageSize())
	}
	return nil
}

// checkEncoded refuses an encoding of n bytes that a durable queue cannot
// store: more than the limit of WithMaxMessageSize, or than the log holds.
func (m *MQ) checkEncoded(n int) error {
	if limit := min(m.maxMessageSize(), defaultMaxMessageSize); n > limit {
		return fmt.Errorf("%w: encoded in %d bytes, more than %d", ErrTooLarge, n, limit)
	}
	return nil
}

// WithRetry gives the queue a retry policy. Without one, a message gets one
// attempt. A message that used up its attempts, or whose consumer returned a
// [Permanent] error, is dead-lettered (see [WithDeadLetter]) with reason
// [ReasonRejected].
func WithRetry(p RetryPolicy) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		n, err := p.normalize()
		if err != nil {
			return err
		}
		c.retry = n
		return nil
	})
}

// WithDeadLetter makes the queue publish its dead messages (see [DeathReason])
// to exchange, with routingKey, or with their own routing key when routingKey
// is "". The message keeps its data and headers and gains a [Death] at the
// front of [Msg.Deaths]. The exchange need not exist yet; if it does not exist
// or cannot route the message when the time comes, the message is logged and
// counted as dropped. Without a dead-letter exchange, dead messages are logged
// and counted as dropped.
//
// As in RabbitMQ, a message that would be dead-lettered for expiry or length
// into a queue it already died in that way is dropped instead, to break the
// cycle.
func WithDeadLetter(exchange, routingKey string) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if exchange == "" {
			return fmt.Errorf("%w: dead-letter exchange", ErrEmptyName)
		}
		if len(routingKey) > maxKeyLen {
			return ErrKeyTooLong
		}
		c.dlx, c.dlxKey = exchange, routingKey
		return nil
	})
}

// WithMessageTTL gives every message of the queue a time to live, counted from
// when it is enqueued (after any delay). A message still waiting when its TTL
// passes is never handed to a consumer: it is dead-lettered with reason
// [ReasonExpired] when it reaches the front of the queue. With a per-message
// TTL too ([WithExpiration]), the shorter applies.
func WithMessageTTL(ttl time.Duration) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if ttl <= 0 {
			return fmt.Errorf("%w: TTL %v", ErrInvalidOption, ttl)
		}
		c.ttl = ttl
		return nil
	})
}

// Overflow says what a queue at its length limit does with one more message.
type Overflow uint8

const (
	// DropHead makes room by dead-lettering the oldest ready message with reason
	// [ReasonMaxLen]. Publish succeeds.
	DropHead Overflow = iota + 1
	// RejectPublish refuses the message: Publish returns [ErrQueueFull] and no
	// queue gets it.
	RejectPublish
	// Block makes Publish wait for room, until its context ends
	// ([MQ.PublishContext]) or Stop begins.
	Block
)

// WithMaxLen limits the queue to n messages, counting those ready and those
// waiting for a delay or a retry, but not those in a consumer. overflow says
// what happens to one more. Queues are unbounded by default.
//
// A publish to an exchange with several matching queues is all or nothing: if
// any of them is full with RejectPublish, Publish returns ErrQueueFull and none
// of them gets the message; if any is full with Block, Publish waits until all
// have room; DropHead queues make room and take it.
func WithMaxLen(n int, overflow Overflow) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: max length %d", ErrInvalidOption, n)
		}
		if overflow < DropHead || overflow > Block {
			return fmt.Errorf("%w: overflow %d", ErrInvalidOption, overflow)
		}
		c.maxLen, c.overflow = n, overflow
		return nil
	})
}
