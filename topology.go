package tinymq

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Topology describes an MQ's exchanges, queues and bindings, for tools such as
// an admin page. It is a copy: changing it changes nothing in the MQ.
type Topology struct {
	// Exchanges are sorted by name.
	Exchanges []ExchangeInfo
	// Queues are in registration order.
	Queues []QueueInfo
}

// ExchangeInfo describes one exchange: as it was declared, and its bindings.
type ExchangeInfo struct {
	ExchangeSpec
	// Bindings are what each RegisterQueue or Bind call asked of the
	// exchange, in the order they were made.
	Bindings []BindingSpec
	// DeduplicationWindow is [WithDeduplication]'s window, or 0. It is not
	// part of ExchangeSpec: an [Engine] refuses WithDeduplication.
	DeduplicationWindow time.Duration
}

// QueueInfo describes one queue's configuration.
type QueueInfo struct {
	Name        string
	Concurrency int
	// MaxAttempts is how many deliveries a message gets (1 without WithRetry).
	MaxAttempts int
	// MessageTTL is [WithMessageTTL], or 0.
	MessageTTL time.Duration
	// MaxLen and Overflow are [WithMaxLen], or 0.
	MaxLen   int
	Overflow Overflow
	// DeadLetterExchange and DeadLetterKey are [WithDeadLetter], or "".
	DeadLetterExchange string
	DeadLetterKey      string
	// Filtered says whether the queue has a [WithFilter].
	Filtered bool
	// Durable says whether the queue keeps its messages in the log
	// ([WithDurable]).
	Durable bool
	// Expiry is [WithQueueExpiry], or 0.
	Expiry time.Duration
	// Consumers is how many consumers the queue has: its RegisterQueue's,
	// and each [MQ.Consume] not cancelled. Concurrency is their workers, in
	// all.
	Consumers int
	// Paused says whether [MQ.PauseQueue] paused the queue.
	Paused bool
	// DeliveryTimeout is [WithDeliveryTimeout], or 0.
	DeliveryTimeout time.Duration
	// RateLimit (deliveries a second) and RateBurst are [WithRateLimit], or
	// 0.
	RateLimit float64
	RateBurst int
	// GroupOrdering says whether the queue has [WithGroupOrdering].
	GroupOrdering bool
	// PayloadType names the payload type of a typed queue, whose consumer
	// came from [RegisterHandler] or its kin, as [reflect.Type.String]
	// writes it ("orders.Order", "[]uint8"); it is "" for a queue that
	// takes any Data. A queue keeps its type for its life. A [QueueSpec]
	// has it "": an engine's consumer is a [ConsumerFunc].
	PayloadType string
}

// BindingInfo is the name [Topology] gave a binding before it shared
// [BindingSpec] with the [Engine] contract.
//
// Deprecated: use BindingSpec.
type BindingInfo = BindingSpec

// queueInfo describes the queue that cfg configures.
func queueInfo(name string, concurrency int, cfg queueConfig) QueueInfo {
	return QueueInfo{Name: name, Concurrency: concurrency, MaxAttempts: max(cfg.retry.MaxAttempts, 1),
		MessageTTL: cfg.ttl, MaxLen: cfg.maxLen, Overflow: cfg.overflow,
		DeadLetterExchange: cfg.dlx, DeadLetterKey: cfg.dlxKey, Filtered: cfg.filter != nil,
		Durable: cfg.durable, Expiry: cfg.expiry,
		DeliveryTimeout: cfg.deliveryTimeout, RateLimit: cfg.rate, RateBurst: cfg.burst, GroupOrdering: cfg.groups}
}

// Topology returns the MQ's exchanges, queues and bindings. It does not block
// on consumers and works in every state, after Stop included. On an [Engine]
// it describes what this MQ declared.
func (m *MQ) Topology() Topology {
	m.mu.RLock()
	defer m.mu.RUnlock()
	t := Topology{Exchanges: make([]ExchangeInfo, 0, len(m.exchanges)), Queues: make([]QueueInfo, 0, len(m.order))}
	for _, ex := range m.exchanges {
		t.Exchanges = append(t.Exchanges, ExchangeInfo{ExchangeSpec: ExchangeSpec{Name: ex.name, Kind: ex.kind, Alternate: ex.cfg.alternate},
			Bindings: slices.Clone(ex.bindings), DeduplicationWindow: ex.cfg.dedup})
	}
	slices.SortFunc(t.Exchanges, func(a, b ExchangeInfo) int { return strings.Compare(a.Name, b.Name) })
	for _, q := range m.order {
		q.lock()
		qi := queueInfo(q.name, q.active, q.cfg)
		qi.Consumers, qi.Paused = len(q.subs), q.paused
		q.mu.Unlock()
		if pt := m.payloads[q]; pt != nil { // m.payloads is guarded by m.mu, held
			qi.PayloadType = pt.String()
		}
		t.Queues = append(t.Queues, qi)
	}
	return t
}

// TopologyVersion returns a number that changes whenever what
// [MQ.Topology] returns may have changed, so that a caller that keeps a
// Topology (a metrics exporter, an admin page) reads another only when the
// number moved. Every call that takes the MQ's write lock increases it
// before it returns, one that changed nothing included: declaring,
// binding, unbinding and deleting exchanges and queues (a queue's expiry
// too), Consume, Start and the restore of a data directory; so do a
// [Subscription.Cancel] and a [MQ.PauseQueue] or ResumeQueue that changed
// the queue (QueueInfo's Consumers, Concurrency and Paused). It never blocks, allocates nothing and
// works in every state; it starts at 0 for a new MQ.
func (m *MQ) TopologyVersion() uint64 {
	return m.topologyClock().Load()
}

// topologyClock is the counter of TopologyVersion; unlock increases it
// while it still holds the write lock, so that once a change returned, a
// TopologyVersion read after it sees the new number, and a Topology read
// after that sees the change.
func (m *MQ) topologyClock() *atomic.Uint64 {
	return &m.topologyVersion
}

// DeadLetter records one message that died in a queue: dead-lettered, or
// dropped for want of a dead-letter exchange that could take it.
type DeadLetter struct {
	Death
	// DeadLetterExchange is where it was published, or "" when it was dropped.
	DeadLetterExchange string
	// Dropped says that it was dropped; DropCause says why.
	Dropped   bool
	DropCause string
}

// recentDeadLetters is how many dead letters [MQ.RecentDeadLetters] keeps.
const recentDeadLetters = 64

// deadLetterRing keeps the latest dead letters. Dead-lettering is rare, so
// one mutex will do.
type deadLetterRing struct {
	mu   sync.Mutex
	buf  [recentDeadLetters]DeadLetter
	next int
	n    int
}

func (r *deadLetterRing) add(d DeadLetter) {
	r.mu.Lock()
	r.buf[r.next] = d
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
	r.mu.Unlock()
}

// RecentDeadLetters returns the latest messages (at most 64) that died in any
// queue, dead-lettered or dropped, the newest first. It does not block on
// consumers and works in every state. An [Engine] keeps none.
func (m *MQ) RecentDeadLetters() []DeadLetter {
	r := &m.deadLetters
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DeadLetter, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}
