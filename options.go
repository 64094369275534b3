package tinymq

import (
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"time"
)

// funcID identifies a function value, or 0 for nil.
func funcID(f func(*Msg) bool) uintptr {
	if f == nil {
		return 0
	}
	return reflect.ValueOf(f).Pointer()
}

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
	expiry   time.Duration // WithQueueExpiry
	flow                   // WithDeliveryTimeout, WithRateLimit
	groups   bool          // WithGroupOrdering
}

// same reports whether c and o ask for the same queue, bindings aside: what
// DeclareQueue compares when a queue of that name exists. Filters are
// compared by function value.
func (c queueConfig) same(o queueConfig) bool {
	return c.retry == o.retry && c.ttl == o.ttl && c.maxLen == o.maxLen && c.overflow == o.overflow &&
		c.dlx == o.dlx && c.dlxKey == o.dlxKey && c.durable == o.durable && c.expiry == o.expiry &&
		funcID(c.filter) == funcID(o.filter) && c.flow == o.flow && c.groups == o.groups
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
// makes Publish return an error wrapping a [*PanicError]. For a dead letter,
// keep runs on a goroutine of the MQ's, and a panic or a runtime.Goexit in it
// drops that dead letter (logged, and counted in [QueueStats].Dropped).
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

// WithQueueExpiry deletes the queue once it has been unused for d: no
// consumer, no [MQ.Consume] and no declare of it again for that long, as
// RabbitMQ's x-expires does. Its waiting messages go with it, counted in
// [Stats].Deleted and logged, not dead-lettered (as in RabbitMQ). The clock
// starts when the queue is declared, or when its last consumer is cancelled,
// and expiry happens only while the MQ runs. d must be positive.
func WithQueueExpiry(d time.Duration) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: queue expiry %v", ErrInvalidOption, d)
		}
		c.expiry = d
		return nil
	})
}

// DeleteOption is a condition of [MQ.DeleteQueue] or [MQ.DeleteExchange].
type DeleteOption interface {
	applyDelete(*deleteConfig)
}

type deleteConfig struct {
	ifUnused, ifEmpty bool
}

type deleteOptionFunc func(*deleteConfig)

func (f deleteOptionFunc) applyDelete(c *deleteConfig) { f(c) }

// IfUnused makes [MQ.DeleteQueue] refuse, with [ErrInUse], a queue that has
// a consumer, and [MQ.DeleteExchange] an exchange that has bindings, as
// RabbitMQ's if-unused flag does.
func IfUnused() DeleteOption { return deleteOptionFunc(func(c *deleteConfig) { c.ifUnused = true }) }

// IfEmpty makes [MQ.DeleteQueue] refuse, with [ErrNotEmpty], a queue in which
// messages wait or are in a consumer, as RabbitMQ's if-empty flag does.
// [MQ.DeleteExchange] refuses it with [ErrInvalidOption].
func IfEmpty() DeleteOption { return deleteOptionFunc(func(c *deleteConfig) { c.ifEmpty = true }) }

func deleteOptions(opts []DeleteOption) (deleteConfig, error) {
	var c deleteConfig
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil DeleteOption", ErrInvalidOption)
		}
		o.applyDelete(&c)
	}
	return c, nil
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

// WithLogger sets the logger that TinyMQ reports to what it cannot return as an
// error: failed deliveries (with the keys exchange, queue, msg_id, err, and stack
// for panics) and messages a shutdown left undelivered. Without it (or with a
// nil logger) warnings and errors, every message dropped or left undelivered
// among them, go to [slog.Default]'s handler at the time of each line, and
// lines below a warning are dropped. WithLogger(slog.New(slog.DiscardHandler))
// discards everything.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(m *MQ) {
		if l != nil {
			m.log = l
		}
	})
}

// WithCodec sets the codec of messages that leave memory (see [Codec]). A nil
// codec, like the default, is [JSONCodec].
func WithCodec(c Codec) Option {
	return optionFunc(func(m *MQ) {
		if c != nil {
			m.codec = c
		}
	})
}

// WithEngine makes the MQ run on e instead of in memory. A nil e, like the
// default, keeps the MQ in memory.
// An Engine serves one MQ: give each MQ an option of its own (such as a new
// amqp.Engine call). An MQ given an Engine that serves another MQ, which has
// not shut down, fails every call with an error wrapping [ErrInvalidOption],
// and the other MQ is not affected. See [Engine].
func WithEngine(e Engine) Option {
	return optionFunc(func(m *MQ) {
		if e != nil {
			m.engine = e
		}
	})
}

// WithDataDir makes the MQ keep the messages of its durable queues
// ([WithDurable]) in a write-ahead log in dir, created if missing. The log is
// opened by the first RegisterQueue of a durable queue, or by Start; a second
// MQ, in this process or another, opening the same dir gets an error wrapping
// [ErrLocked] from that call. Stop and Shutdown close it.
//
// With a data directory, message IDs stay unique across restarts: each
// exchange reserves its IDs in blocks recorded in the log. An MQ on an
// [Engine] keeps no log (the broker keeps the messages): its Start returns
// [ErrUnsupported].
func WithDataDir(dir string) Option {
	return optionFunc(func(m *MQ) { m.dataDir = dir })
}

// WithLogRepair lets the MQ open a write-ahead log that is damaged before its
// end (a bad record followed by good ones; a torn tail left by a crash is
// always cut): the log is cut at the first bad byte, the bytes cut are kept
// beside it in files named "<segment>.corrupt-<offset>", and what was cut is
// logged. Without it such a log makes Start (or the first RegisterQueue of a
// durable queue) fail with an error wrapping [ErrLog] that names the file and
// the offset. Messages after the damage are lost to the MQ, so repair only
// after keeping a copy of the directory.
func WithLogRepair() Option {
	return optionFunc(func(m *MQ) { m.repairLog = true })
}

// WithSync sets how a Publish to a durable queue waits for the disk. With 0,
// the default, Publish returns nil only once the message is on disk (an
// fdatasync covers it); concurrent publishers share one fdatasync (group
// commit), so throughput grows with them. With an interval d > 0, Publish
// returns once the message is written to the operating system, and the log is
// synced at least every d: a crash of the process loses nothing, a crash of
// the machine or a power loss loses the messages of the last d. Whatever d,
// [MQ.DeleteQueue], [MQ.PurgeQueue] and an expiry return (or log) only once
// their record is synced: what they removed never comes back. A negative d
// is invalid: the calls that open the log ([MQ.Start], and [MQ.RegisterQueue]
// or [MQ.DeclareExchange] on an MQ with a data directory) return an error
// wrapping [ErrInvalidOption].
func WithSync(d time.Duration) Option {
	return optionFunc(func(m *MQ) { m.syncEvery = d })
}

// WithDurable makes the queue keep its messages in the MQ's write-ahead log
// (see [WithDataDir]), so that they survive a crash or a kill -9: a Publish
// that reached the queue returned nil only once the message was on disk, and
// on the next Start with the same directory, after the queue is registered
// again under the same name, every message that its consumer had not
// acknowledged (returned nil for) is delivered again, with
// [Msg.Redelivered] set. Retry attempts and backoffs, delays, TTL deadlines
// and death records survive too.
//
// Data reaches the consumer of a durable queue as an [Encoded], made by the
// MQ's [Codec], every time, before and after a restart alike; a [Handler]
// consumer gets its type T as on any queue. The queue needs a stable name
// ([WithQueueName]) and the MQ a data directory; otherwise RegisterQueue
// returns [ErrInvalidOption]. An [Engine] refuses it with [ErrUnsupported]:
// the broker keeps the queue's messages.
func WithDurable() QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		c.durable = true
		return nil
	})
}

// ExchangeOption configures an exchange in [MQ.DeclareExchange].
type ExchangeOption interface {
	applyExchange(*exchangeConfig) error
}

// WithAlternateExchange names the exchange that receives, with the same routing
// key and headers, every message this exchange cannot route to any queue, as
// RabbitMQ's alternate-exchange argument does. Publish returns [ErrNoRoute] only
// when the alternate exchange cannot route it either (or does not exist).
func WithAlternateExchange(name string) ExchangeOption {
	return exchangeOptionFunc(func(c *exchangeConfig) error { c.alternate = name; return nil })
}

// PublishOption configures one Publish call. Options are plain values, so
// passing them allocates nothing. Make them with the With functions; Publish
// refuses the zero PublishOption with [ErrInvalidOption].
type PublishOption struct {
	kind    publishOptionKind
	key     string
	headers map[string]any
	d       time.Duration
}

type publishOptionKind uint8

const (
	_ publishOptionKind = iota
	optRoutingKey
	optHeaders
	optExpiration
	optDelay
)

// WithRoutingKey sets the message's routing key, which direct and topic
// exchanges route by. It is at most 255 bytes; fanout and headers exchanges
// ignore it but still hand it to the consumer in [Msg.RoutingKey].
func WithRoutingKey(key string) PublishOption {
	return PublishOption{kind: optRoutingKey, key: key}
}

// WithHeaders sets the message's headers, which headers exchanges route by.
// Values must have an AMQP equivalent: nil, bool, the Go integer types but
// uintptr (uint and uint64 only up to math.MaxInt64, AMQP's largest), the
// float types, string, []byte, time.Time, []any and map[string]any of those,
// nested at most 32 deep, holding at most 65536 values (nested ones
// included) and 1 MiB of keys, strings and byte arrays in all, where a table
// or array that appears in several places counts in each; a table or array
// that contains itself is refused. Through a durable queue's log every value keeps its
// Go type; a time.Time comes back as the same instant (compare with Equal).
// Publish returns [ErrInvalidHeaders] otherwise. The map is shared with the
// consumers, not copied: do not modify it after Publish.
func WithHeaders(h map[string]any) PublishOption {
	return PublishOption{kind: optHeaders, headers: h}
}

// WithExpiration gives the message a time to live in every queue it reaches
// (RabbitMQ's expiration property), counted
// from when it is enqueued (after any delay): once it passes, the message is
// never handed to a consumer but dead-lettered with reason [ReasonExpired]. A
// queue's own TTL ([WithMessageTTL]) applies too; the shorter wins.
func WithExpiration(ttl time.Duration) PublishOption {
	return PublishOption{kind: optExpiration, d: ttl}
}

// WithDelay makes the message visible to consumers only after d. Publish
// returns at once; the message counts as accepted (and towards a queue's
// length limit) while it waits, and Stop waits for it.
func WithDelay(d time.Duration) PublishOption {
	return PublishOption{kind: optDelay, d: d}
}

// Deduplication: WithDeduplication and WithDeduplicationID.

// optDedupID is WithDeduplicationID's kind, apart from the block above so
// that options added there do not collide with it.
const optDedupID publishOptionKind = 64

// WithDeduplication makes the exchange remember, for window after it accepted
// a message, the ID its publisher gave it with [WithDeduplicationID]: a
// Publish of an ID accepted within the window returns nil without routing
// the message again, and counts in [ExchangeStats].Duplicates, so that a
// producer that retries after a timeout or a crash sees success and creates
// no duplicate. The window counts from when the first publish was accepted.
//
// Memory is bounded: the exchange remembers at most 65536 IDs (plus one for
// each publish of a new ID still under way), each costing about 100 bytes
// plus its length; past that bound the oldest ID is forgotten before its
// window ends, and a retry of it is routed again. A publish that failed
// (Publish returned an error) leaves no ID behind.
//
// With a data directory ([WithDataDir]) the ID of a message that reached a
// durable queue is written to the log in the same record as the message, so
// that the window survives a restart or a crash: a retry after the restart,
// once the exchange is declared again with WithDeduplication, is a
// duplicate. The ID of a message that reached only in-memory queues is kept in
// memory only: that message does not survive a restart either, so a retry
// after the restart publishes it again.
//
// window must be positive; DeclareExchange returns [ErrInvalidOption]
// otherwise, and [ErrUnsupported] on an [Engine]. Declaring the exchange
// again with another window returns [ErrExchangeMismatch].
func WithDeduplication(window time.Duration) ExchangeOption {
	return exchangeOptionFunc(func(c *exchangeConfig) error {
		if window <= 0 {
			return fmt.Errorf("%w: deduplication window %v", ErrInvalidOption, window)
		}
		c.dedup = window
		return nil
	})
}

// WithDeduplicationID gives the message an ID, 1 to 255 bytes, that its
// exchange ([WithDeduplication]) routes at most once within its window: a
// Publish of an ID already accepted returns nil and routes nothing. Two
// concurrent publishes of one ID route it once: the second waits for the
// first (until its ctx ends) and returns nil once the first is accepted; if
// the first failed, the second is routed in its turn and returns its own
// outcome. Publish returns [ErrInvalidOption] for an empty or longer ID, or
// for an exchange without WithDeduplication (routing it anyway would break
// the promise the producer relies on), and [ErrUnsupported] on an [Engine].
func WithDeduplicationID(id string) PublishOption {
	return PublishOption{kind: optDedupID, key: id}
}

// Delivery timeout and rate limit: the options that pace a queue's
// consumers.

// flow is what WithDeliveryTimeout and WithRateLimit ask of a queue.
type flow struct {
	deliveryTimeout time.Duration // WithDeliveryTimeout; 0: none
	rate            float64       // WithRateLimit: deliveries per second; 0: no limit
	burst           int           // WithRateLimit's burst
}

// WithDeliveryTimeout gives each delivery d to complete: the consumer's
// context has a deadline d after the call begins, and a consumer that has
// not returned by then has failed with an error wrapping
// [ErrDeliveryTimeout]. The queue's retry policy then applies, and
// dead-lettering after the last attempt, as for any failure; what the late
// call returns is ignored (it is not acknowledged, nor logged). A consumer
// that returns once its deadline passed has failed with ErrDeliveryTimeout
// too, even when it returns nil; when its return is seen before the
// deadline's own handler fails the call, the error also wraps what it
// returned (such as ctx.Err()), otherwise only ErrDeliveryTimeout. The
// consumer's *Msg is a copy of its own: what the late call does with it
// never reaches the MQ.
//
// In a queue with [WithGroupOrdering], a timed-out message has ended its
// turn: its retry, or the next message of its group, may run while the
// abandoned call still does. A consumer that needs one call at a time per
// group must watch its context.
//
// The late call is abandoned, not killed (Go cannot stop a goroutine): a new
// goroutine takes its worker slot, so the queue keeps its concurrency, while
// the old one ends when its consumer returns. A consumer should therefore
// watch its context. Each subscription keeps at most as many abandoned calls
// as it has workers; past that bound, a call that times out still fails at
// d, but its worker waits for it to return before it takes another message.
// [QueueStats].Abandoned shows the calls abandoned now, and TimedOut counts
// the timeouts. [MQ.Stop] and [Subscription.Cancel] wait for the abandoned
// calls to return, as they wait for any consumer; [MQ.Shutdown]'s deadline
// bounds that wait, and Shutdown then reports them in its error.
//
// A queue without this option has no timer and no goroutine per delivery.
// d must be positive; an [Engine] refuses it with [ErrUnsupported].
func WithDeliveryTimeout(d time.Duration) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: delivery timeout %v", ErrInvalidOption, d)
		}
		c.deliveryTimeout = d
		return nil
	})
}

// WithRateLimit lets the queue's deliveries begin at most perSecond times a
// second, with bursts of up to burst: a token bucket, full at first, that
// holds burst tokens and gains perSecond of them a second; each delivery
// (retries included) takes one. It limits the queue as a whole, whatever its
// concurrency and number of consumers. A worker that finds no token waits,
// and messages wait in the queue meanwhile: their TTLs run, and an expired
// head is dead-lettered as usual. The limit costs no goroutine and no timer
// of its own: the MQ's scheduler wakes the queue when the next token is
// due. A rate-limited queue hands out one message at a time, as a queue
// with a TTL does.
//
// perSecond must be positive and finite, and burst at least 1; otherwise
// RegisterQueue returns [ErrInvalidOption]. An [Engine] refuses it with
// [ErrUnsupported].
func WithRateLimit(perSecond float64, burst int) QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		if !(perSecond > 0) || math.IsInf(perSecond, 1) {
			return fmt.Errorf("%w: rate limit %v a second", ErrInvalidOption, perSecond)
		}
		if burst < 1 {
			return fmt.Errorf("%w: rate limit burst %d", ErrInvalidOption, burst)
		}
		c.rate, c.burst = perSecond, burst
		return nil
	})
}

// Message groups (WithMessageGroup, WithGroupOrdering).

// maxGroupLen is the longest group ID WithMessageGroup takes, in bytes.
const maxGroupLen = 255

// optGroup is WithMessageGroup's kind, apart from the kinds above so that
// their blocks do not collide.
const optGroup publishOptionKind = 65

// WithMessageGroup puts the message in group id (1 to 255 bytes; Publish
// refuses any other with [ErrInvalidOption]). A queue with
// [WithGroupOrdering] hands the messages of one group over one at a time, in
// publish order; any other queue ignores the group, and every consumer sees
// it in [Msg.Group].
func WithMessageGroup(id string) PublishOption {
	return PublishOption{kind: optGroup, key: id}
}

// WithGroupOrdering orders the queue's messages by group ([WithMessageGroup]):
// the messages of one group are handed over one at a time, in publish order,
// retries included, so that a message that fails and waits for its retry
// holds back the later messages of its group (and only those) until it has
// succeeded, been dead-lettered or dropped. Different groups are delivered in
// parallel across the queue's workers, and messages without a group as in
// any queue. A queue with no consumer, or paused, keeps its groups waiting;
// a durable queue keeps each group's order across a restart. A message
// published [WithDelay] joins its group when its delay ends, behind the
// messages of the group that joined before. Workers of such a queue take one
// message at a time. A message behind an earlier one of its
// group is not yet at the front of the queue: its TTL ([WithMessageTTL],
// [WithExpiration]) is checked when it is its group's next and reaches the
// front, as RabbitMQ checks TTLs only at the head of a queue. An [Engine]
// refuses it with [ErrUnsupported].
func WithGroupOrdering() QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		c.groups = true
		return nil
	})
}
