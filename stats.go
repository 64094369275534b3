package tinymq

import (
	"maps"
	"time"

	"github.com/tinymq/tinymq/internal/hist"
)

// Stats is a snapshot of an MQ's counters, from [MQ.Stats].
type Stats struct {
	Exchanges map[string]ExchangeStats
	Queues    map[string]QueueStats
	// Deleted adds up the counts of every queue deleted so far
	// ([MQ.DeleteQueue], [WithQueueExpiry]), including what their
	// deliveries in flight did after the delete; its ConsumerTime is zero.
	Deleted QueueStats
	// DeletedQueues counts those queues, and ExpiredQueues those of them
	// that expired.
	DeletedQueues, ExpiredQueues uint64
	// Blocked is, on an engine whose broker holds back this MQ's publishes
	// (RabbitMQ's connection.blocked, during a memory or disk alarm), the
	// broker's reason; "" otherwise, and always in memory.
	Blocked string
}

// ExchangeStats counts what was published to one exchange.
type ExchangeStats struct {
	Kind ExchangeType
	// Published counts the messages accepted (Publish returned nil), each once
	// however many queues it reached. Without a data directory the last one's
	// [Msg.ID] equals it.
	Published uint64
	// Unroutable counts the publishes refused with [ErrNoRoute].
	Unroutable uint64

	// Duplicates counts the publishes that returned nil without routing
	// anything, since [WithDeduplication] found their [WithDeduplicationID]
	// accepted within the window; they are not in Published.
	Duplicates uint64
}

// QueueStats counts what happened in one queue. Every accepted message ends
// in exactly one of Succeeded, DeadLettered, Dropped, Undelivered, Purged,
// Replayed or Removed; until then
// it is counted in Depth or InFlight. Counters only grow. The fields are read
// one at a time while messages move (the workers count without a lock), so
// while a queue is busy these sums may be off by the few messages that moved
// during the read; once it is idle, they add up exactly. InFlight never
// exceeds the queue's concurrency.
type QueueStats struct {
	// Depth is how many messages wait: Ready plus Scheduled.
	Depth int
	// Ready is how many messages wait for a worker: in the queue, or taken by
	// a worker in a batch and not yet begun.
	Ready int
	// Scheduled is how many messages wait for a delay or a retry backoff.
	Scheduled int
	// InFlight is how many messages are in the consumer now.
	InFlight int
	// OldestAge is how long the oldest ready message has waited for a
	// consumer: since it was published into the queue, or its delay or
	// retry backoff ended, or (restored from the log) since that happened
	// before the restart. It is zero when no message is ready, and on an
	// engine. It is read from a clock that the MQ refreshes every 10 ms
	// while messages come in, so it may be up to about that much more than
	// the truth, never less. Messages waiting behind their group
	// (WithGroupOrdering) and those taken by a worker and not begun count;
	// those in a consumer do not.
	OldestAge time.Duration

	// Accepted counts the messages published into the queue.
	Accepted uint64
	// Delivered counts consumer calls, retries included.
	Delivered uint64
	// Succeeded counts consumer calls that returned nil.
	Succeeded uint64
	// Failed counts consumer calls that returned an error or panicked.
	Failed uint64
	// Retried counts failed calls that were scheduled for another attempt.
	Retried uint64
	// DeadLettered counts messages published to the dead-letter exchange.
	DeadLettered uint64
	// Expired counts messages whose TTL passed before a consumer got them
	// (then dead-lettered or dropped).
	Expired uint64
	// Overflowed counts messages that DropHead evicted (then dead-lettered or
	// dropped).
	Overflowed uint64
	// Rejected counts publishes refused because the queue was full
	// (RejectPublish; dead letters refused by a full queue of any kind).
	Rejected uint64
	// Dropped counts dead messages with no dead-letter exchange, or one that
	// could not route them. Each was logged.
	Dropped uint64
	// Undelivered counts messages that a Shutdown deadline, or a Stop before
	// Start, kept from a consumer, and those that Stop left in a queue with
	// no consumer or a paused one. They were logged (a durable queue's stay
	// in the log for the next start).
	Undelivered uint64
	// Purged counts the messages that [MQ.PurgeQueue] removed. They were
	// logged.
	Purged uint64
	// Replayed counts the messages that [MQ.ReplayDeadLetters] moved out of
	// the queue, back to where they died.
	Replayed uint64
	// Removed counts, in [Stats].Deleted, the messages that the deletes of
	// their queues removed ([MQ.DeleteQueue], [WithQueueExpiry]): waiting
	// ones, and those whose delivery failed after the delete. They were
	// logged. It is 0 for a queue that exists.
	Removed uint64

	// Consumers is how many consumers the queue has (see
	// [QueueInfo].Consumers), and Paused whether [MQ.PauseQueue] paused it.
	Consumers int
	Paused    bool

	// Durable says that the queue keeps its messages in the write-ahead log
	// ([WithDurable]).
	Durable bool
	// Unregistered marks a durable queue whose messages (or whose
	// declaration) the log holds but that this process has not declared
	// (yet): Depth and Ready count its messages, OldestAge is that of the
	// oldest that is ready, and every other field is zero. They are never
	// deleted unasked.
	Unregistered bool
	// Stored counts the messages that the log holds for a durable queue of
	// this name which this queue does not take, because it was registered
	// without [WithDurable]. They are never deleted unasked: a later MQ that
	// registers the queue WithDurable gets them.
	Stored int

	// Abandoned is how many consumer calls outlived [WithDeliveryTimeout]
	// and still run, their worker slots taken by new goroutines (each
	// subscription at most as many as it has workers; a cancelled
	// subscription's stay counted until they return), and TimedOut counts the deliveries that failed
	// with [ErrDeliveryTimeout] (each also counts in Failed).
	Abandoned int
	TimedOut  uint64

	// ConsumerTime summarizes how long the consumer took, from a sample of
	// the calls that returned (every one when the queue is not busy). A
	// call that outlived WithDeliveryTimeout is counted in TimedOut instead,
	// and one that ended its goroutine (runtime.Goexit) is not timed.
	ConsumerTime DurationStats
}

// DurationStats summarizes sampled durations. The quantiles are upper bounds
// read from power-of-two buckets: within a factor of 2 of the true value.
type DurationStats struct {
	Samples       uint64
	Mean          time.Duration
	P50, P90, P99 time.Duration
	Max           time.Duration
}

// Stats returns a snapshot of every exchange's and queue's counters. It takes
// each queue's lock briefly, one at a time, so it is cheap enough to call every
// second and does not stop publishers; the numbers of different queues are
// not taken at one instant. It works in every state, after Stop included.
func (m *MQ) Stats() Stats {
	if m.engine != nil {
		if st := m.final.Load(); st != nil {
			c := *st // maps of its own, as every Stats has
			c.Exchanges, c.Queues = maps.Clone(st.Exchanges), maps.Clone(st.Queues)
			return c
		}
		return m.engine.Stats()
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := Stats{
		Exchanges: make(map[string]ExchangeStats, len(m.exchanges)),
		Queues:    make(map[string]QueueStats, len(m.order)),
	}
	for name, ex := range m.exchanges {
		s.Exchanges[name] = exchangeStats(ex)
	}
	stored, unregistered := m.durableQueuesLocked()
	for _, q := range m.order {
		qs := q.stats()
		qs.Stored = stored[q.name]
		s.Queues[q.name] = qs
	}
	s.Deleted = m.deletedStats(false)
	s.DeletedQueues, s.ExpiredQueues = m.deletedQueues, m.expiredQueues
	for _, u := range unregistered {
		s.Queues[u.name] = u.stats
	}
	return s
}

func (q *queue) stats() QueueStats {
	q.lock()
	qs := QueueStats{Ready: q.buf.n + q.batchedLocked() + q.grouped, Scheduled: q.scheduled, Accepted: q.accepted,
		Consumers: len(q.subs), Paused: q.paused}
	qs.InFlight = int(q.inFlightLocked())
	oldest := q.oldestLocked()
	qs.Abandoned = q.abandoned
	c := &q.c
	// What ended is read before what began, so that no snapshot shows more
	// ended than delivered.
	qs.Succeeded, qs.Failed = q.succeededLocked(), c.failed.Load()
	qs.Delivered = q.deliveredLocked()
	q.mu.Unlock()
	if oldest != 0 {
		qs.OldestAge = max(time.Duration(time.Now().UnixNano()-oldest), 0)
	}
	qs.Depth = qs.Ready + qs.Scheduled
	qs.Durable = q.cfg.durable
	qs.Retried, qs.DeadLettered, qs.Expired = c.retried.Load(), c.deadLettered.Load(), c.expired.Load()
	qs.Overflowed, qs.Rejected, qs.Dropped = c.overflowed.Load(), c.rejected.Load(), c.dropped.Load()
	qs.Undelivered = c.undelivered.Load()
	qs.Purged, qs.Removed, qs.Replayed = c.purged.Load(), c.removed.Load(), c.replayed.Load()
	qs.TimedOut = c.timedOut.Load()
	qs.ConsumerTime = q.hist.snapshot()
	return qs
}

// oldestLocked returns the stamp (see entry) of the oldest ready entry, or 0
// when none is ready: the head of buf, the first unclaimed entry of each
// worker's batch, and the head of each group's backlog. (A group's next
// message joins the tail of buf with the stamp it got in the backlog: see
// fifo.floors.) q.mu is held.
func (q *queue) oldestLocked() int64 {
	var at int64
	older := func(t int64) {
		if t != 0 && (at == 0 || t < at) {
			at = t
		}
	}
	older(q.buf.oldest())
	for _, w := range q.workers {
		if i := int(w.next.Load()); i < w.n {
			older(w.ats[i])
		}
	}
	if q.grouped > 0 {
		for _, st := range q.groups {
			older(st.waiting.oldest())
		}
	}
	return at
}

// add adds o's counts to s: the sum of deleted queues. Their times are not
// added up.
func (s *QueueStats) add(o QueueStats) {
	s.Depth += o.Depth
	s.Ready += o.Ready
	s.Scheduled += o.Scheduled
	s.InFlight += o.InFlight
	s.Accepted += o.Accepted
	s.Delivered += o.Delivered
	s.Succeeded += o.Succeeded
	s.Failed += o.Failed
	s.Retried += o.Retried
	s.DeadLettered += o.DeadLettered
	s.Expired += o.Expired
	s.Overflowed += o.Overflowed
	s.Rejected += o.Rejected
	s.Dropped += o.Dropped
	s.Undelivered += o.Undelivered
	s.Purged += o.Purged
	s.Removed += o.Removed
	s.Replayed += o.Replayed
	s.Abandoned += o.Abandoned
	s.TimedOut += o.TimedOut
}

// deletedStats returns the counts of every deleted queue, added up, and
// folds into m.deletedSum those of the queues that have settled (no worker
// and no inbound publish left), which are then forgotten. The caller holds
// the write lock, or the read lock with fold false.
func (m *MQ) deletedStats(fold bool) QueueStats {
	sum := m.deletedSum
	kept := m.deleted[:0]
	for _, q := range m.deleted {
		// settled is read before the counts, so that a worker that leaves
		// meanwhile cannot have its last counts left out of a snapshot that
		// is folded. No worker is not enough: expireHead and a DropHead
		// publish count what they popped once they released q.mu, and so
		// the queue is folded only once every message it accepted has
		// ended; after that nothing can change its counts.
		q.lock()
		settled := len(q.workers) == 0 && q.inbound == 0 && q.abandoned == 0
		q.mu.Unlock()
		qs := q.stats()
		sum.add(qs)
		if !fold {
			continue
		}
		if settled && qs.ended() {
			m.deletedSum.add(qs)
		} else {
			kept = append(kept, q)
		}
	}
	if fold {
		clear(m.deleted[len(kept):])
		m.deleted = kept
	}
	return sum
}

// ended reports whether every message that s counts as accepted has ended,
// and every delivery with it: for a deleted queue, that its counts are final.
func (s QueueStats) ended() bool {
	return s.Depth == 0 && s.InFlight == 0 && s.Delivered == s.Succeeded+s.Failed &&
		s.Accepted == s.Succeeded+s.DeadLettered+s.Dropped+s.Undelivered+s.Purged+s.Removed+s.Replayed
}

// histogram is a queue's consumer-time histogram: the one every engine
// keeps (internal/hist), so that DurationStats means the same on each.
type histogram struct{ hist.Histogram }

func (h *histogram) observe(d time.Duration) { h.Observe(d) }

func (h *histogram) snapshot() DurationStats { return DurationStats(h.Snapshot()) }
