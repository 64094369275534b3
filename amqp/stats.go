package amqp

import (
	"slices"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// Stats reports what this client knows: per exchange, what it published
// and what came back unroutable; per queue, what its subscriptions did, how
// many it has and whether it is paused, what PurgeQueue removed, and the
// depth of the queue and of the retry wait queues this MQ used within their
// lease (see wait.go), read from the broker
// with passive declarations when connected (zero otherwise); the queues
// this MQ deleted, or found expired, added up in Deleted. A passive
// declaration is a use of the queue, which would keep one with an expiry
// from expiring: for such a queue that no subscription of this MQ consumes
// now, Ready is 0, and Stats only asks, with probeQueue, whether the broker
// still has it; one it no longer has expired, and Stats forgets it (see
// expire). It never waits for a connection, and reads on the consuming
// connection, which a broker's resource alarm does not block. Blocked is
// the reason of the broker's connection.blocked on the publishing
// connection, or "".
func (e *engine) Stats() tinymq.Stats {
	st := tinymq.Stats{
		Exchanges: make(map[string]tinymq.ExchangeStats),
		Queues:    make(map[string]tinymq.QueueStats),
	}
	e.topoMu.RLock()
	for name, ex := range e.exchanges {
		st.Exchanges[name] = tinymq.ExchangeStats{
			Kind:       kindOf(ex.kind),
			Published:  ex.published.Load(),
			Unroutable: ex.unroutable.Load(),
		}
	}
	e.topoMu.RUnlock()
	e.mu.Lock()
	queues := slices.Clone(e.queues)
	// On the consuming connection: the broker never blocks it (it blocks
	// connections that publish, during a resource alarm, by no longer reading
	// them), so Stats does not wait behind a block.
	conn := e.sub
	e.mu.Unlock()

	// depth reads a queue's ready messages; missing says that the broker
	// does not have it.
	var depth func(name string) (n int, missing bool)
	if conn != nil {
		var ch *amqp091.Channel
		defer func() {
			if ch != nil {
				_ = ch.Close()
			}
		}()
		depth = func(name string) (int, bool) {
			if ch == nil {
				var err error
				if ch, err = conn.Channel(); err != nil {
					return 0, false
				}
			}
			qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				ch = nil // the broker closed the channel (the queue is gone)
				return 0, amqpCode(err) == amqp091.NotFound
			}
			return qi.Messages, false
		}
	} else {
		depth = func(string) (int, bool) { return 0, false }
	}
	now := time.Now()
	for _, q := range queues {
		var ready int
		var missing bool
		if q.spec.Expiry > 0 && !q.consumed() {
			// Reading the depth would count as a use: only ask whether the
			// broker still has it.
			if conn != nil {
				exists, err := probeQueue(conn, q.spec.Name)
				missing = err == nil && !exists
			}
		} else {
			ready, missing = depth(q.spec.Name)
		}
		if missing && q.spec.Expiry > 0 && e.expire(q, conn) {
			continue
		}
		qs := q.counts()
		qs.Ready = ready
		for _, w := range q.waitQs {
			// Only those this MQ used within their lease: the passive
			// declaration is a use, which would keep them forever.
			if e.helpers.recent(w, e.lease(), now) {
				n, _ := depth(w)
				qs.Scheduled += n
			}
		}
		qs.Depth = qs.Ready + qs.Scheduled
		st.Queues[q.spec.Name] = qs
	}
	e.mu.Lock()
	st.Deleted = e.deletedStatsLocked()
	st.DeletedQueues, st.ExpiredQueues = e.deletedQueues, e.expiredQueues
	st.Blocked = e.blocked
	e.mu.Unlock()
	return st
}

// counts returns q's counters.
func (q *cqueue) counts() tinymq.QueueStats {
	q.mu.Lock()
	consumers, paused := len(q.subs), q.paused
	q.mu.Unlock()
	return tinymq.QueueStats{
		InFlight:     int(q.inFlight.Load()),
		Delivered:    q.c.delivered.Load(),
		Succeeded:    q.c.succeeded.Load(),
		Failed:       q.c.failed.Load(),
		Retried:      q.c.retried.Load(),
		DeadLettered: q.c.deadLettered.Load(),
		Dropped:      q.c.dropped.Load(),
		Purged:       q.c.purged.Load(),
		Removed:      q.c.removed.Load(),
		Consumers:    consumers,
		Paused:       paused,
		ConsumerTime: tinymq.DurationStats(q.hist.Snapshot()),
	}
}

// consumed reports whether one of q's subscriptions consumes it now: then
// the broker counts q as used anyway.
func (q *cqueue) consumed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.ContainsFunc(q.subs, func(s *subscription) bool { return s.consuming })
}

// settled reports whether nothing of q, deleted, can count any more: its
// subscriptions have ended and no delivery is in flight.
func (q *cqueue) settled() bool {
	if q.inFlight.Load() > 0 {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range q.retired {
		select {
		case <-s.done:
		default:
			return false
		}
	}
	return true
}

// deletedStatsLocked adds up the counts of the deleted queues, and folds
// into deletedSum those that have settled, which are then forgotten. The
// caller holds mu.
func (e *engine) deletedStatsLocked() tinymq.QueueStats {
	sum := e.deletedSum
	kept := e.deleted[:0]
	for _, q := range e.deleted {
		settled := q.settled()
		qs := q.counts()
		addCounts(&sum, qs)
		if settled {
			addCounts(&e.deletedSum, qs)
		} else {
			kept = append(kept, q)
		}
	}
	clear(e.deleted[len(kept):])
	e.deleted = kept
	return sum
}

// addCounts adds the counters of o that this engine keeps to s.
func addCounts(s *tinymq.QueueStats, o tinymq.QueueStats) {
	s.InFlight += o.InFlight
	s.Delivered += o.Delivered
	s.Succeeded += o.Succeeded
	s.Failed += o.Failed
	s.Retried += o.Retried
	s.DeadLettered += o.DeadLettered
	s.Dropped += o.Dropped
	s.Purged += o.Purged
	s.Removed += o.Removed
}

func kindOf(s string) tinymq.ExchangeType {
	for _, k := range []tinymq.ExchangeType{tinymq.Fanout, tinymq.Direct, tinymq.Topic, tinymq.Headers} {
		if k.String() == s {
			return k
		}
	}
	return 0
}
